"""The shared native ABI contract (eemicrogpt_core.kit.abi_contract) on the four x86 libraries, on one thread
and on the threaded path (the fused train_step hook), where every shared check and non-finite rule must hold."""

from __future__ import annotations

from pathlib import Path

from eemicrogpt_backend_x86.libs import library_path

from eemicrogpt_core.kit.abi_contract import NativeAbiContract


class TestAvx512Abi(NativeAbiContract):
    backend_name = "avx512"

    def library_path(self) -> Path | None:
        return library_path("avx512")


class TestAvx2Abi(NativeAbiContract):
    backend_name = "avx2"

    def library_path(self) -> Path | None:
        return library_path("avx2")


class TestAvx512Bf16Abi(NativeAbiContract):
    backend_name = "avx512_bf16"

    def library_path(self) -> Path | None:
        return library_path("avx512_bf16")


class TestAmxBf16Abi(NativeAbiContract):
    backend_name = "amx_bf16"

    def library_path(self) -> Path | None:
        return library_path("amx_bf16")


class TestAvx512ThreadedAbi(TestAvx512Abi):
    threads = 3  # more than this machine's cores: uneven chunks, one of them possibly empty


class TestAvx2ThreadedAbi(TestAvx2Abi):
    threads = 2


class TestAvx512Bf16ThreadedAbi(TestAvx512Bf16Abi):
    threads = 2


class TestAmxBf16ThreadedAbi(TestAmxBf16Abi):
    threads = 2
