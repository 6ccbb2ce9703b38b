"""The shared native ABI contract (eemicrogpt_core.abi_testing) on both x86 libraries."""

from __future__ import annotations

from pathlib import Path

from eemicrogpt_backend_x86.libs import library_path

from eemicrogpt_core.abi_testing import NativeAbiContract


class TestAvx512Abi(NativeAbiContract):
    backend_name = "avx512"

    def library_path(self) -> Path | None:
        return library_path("avx512")


class TestAvx2Abi(NativeAbiContract):
    backend_name = "avx2"

    def library_path(self) -> Path | None:
        return library_path("avx2")
