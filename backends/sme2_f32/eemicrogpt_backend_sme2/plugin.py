"""Registers sme2_f32 with eemicrogpt: the entry point `eemicrogpt_backend_sme2.plugin:sme2_f32` (spec.py, a
copy of sme2_common/sme2_spec.py, says what it is)."""

from __future__ import annotations

from pathlib import Path

from .spec import Sme2Plugin

PACKAGE_DIR = Path(__file__).resolve().parent
sme2_f32 = Sme2Plugin("sme2_f32", PACKAGE_DIR)
