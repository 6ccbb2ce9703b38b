"""The shared native ABI contract (eemicrogpt_core.abi_testing) on the sme2_f16 and sme2_f16w libraries."""

from __future__ import annotations

from pathlib import Path

from eemicrogpt_backend_sme2_f16 import plugin_f16w
from eemicrogpt_backend_sme2_f16.plugin import LIBRARY_STEM, PACKAGE_DIR

from eemicrogpt_core.abi_testing import NativeAbiContract
from eemicrogpt_core.native import find_library


class TestSme2F16Abi(NativeAbiContract):
    backend_name = "sme2_f16"

    def library_path(self) -> Path | None:
        return find_library(PACKAGE_DIR, LIBRARY_STEM)


class TestSme2F16wAbi(NativeAbiContract):
    backend_name = "sme2_f16w"

    def library_path(self) -> Path | None:
        return find_library(PACKAGE_DIR, plugin_f16w.LIBRARY_STEM)
