"""The shared native ABI contract (eemicrogpt_core.kit.abi_contract) on the neon library."""

from __future__ import annotations

from pathlib import Path

from eemicrogpt_backend_neon.plugin import library_path

from eemicrogpt_core.kit.abi_contract import NativeAbiContract


class TestNeonAbi(NativeAbiContract):
    backend_name = "neon"

    def library_path(self) -> Path | None:
        return library_path()
