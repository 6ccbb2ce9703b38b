"""The shared native ABI contract (eemicrogpt_core.abi_testing): example_c inherits it from emg_backend.h."""

from __future__ import annotations

from pathlib import Path

from eemicrogpt_backend_example_c.plugin import LIBRARY_STEM, PACKAGE_DIR

from eemicrogpt_core.abi_testing import NativeAbiContract
from eemicrogpt_core.native import find_library


class TestExampleCAbi(NativeAbiContract):
    backend_name = "example_c"

    def library_path(self) -> Path | None:
        return find_library(PACKAGE_DIR, LIBRARY_STEM)
