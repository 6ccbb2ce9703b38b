"""Registers sme2_f16 and sme2_f16w with eemicrogpt: the entry points `eemicrogpt_backend_sme2_f16.plugin:
sme2_f16` and `...:sme2_f16w`, one per backend so that EEMICROGPT_DISABLE_PLUGINS can name either (spec.py, a
copy of sme2_common/sme2_spec.py, says what they are)."""

from __future__ import annotations

from pathlib import Path

from .spec import Sme2Plugin

PACKAGE_DIR = Path(__file__).resolve().parent
sme2_f16 = Sme2Plugin("sme2_f16", PACKAGE_DIR)
sme2_f16w = Sme2Plugin("sme2_f16w", PACKAGE_DIR)
