"""The shared native ABI contract (eemicrogpt_core.kit.abi_contract) on the sme2_f16 and sme2_f16w libraries, and
their envelope (the same source as sme2_f32's)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from eemicrogpt_backend_sme2_f16.plugin import PACKAGE_DIR, sme2_f16, sme2_f16w

from eemicrogpt_core.backends.native import _ffi, find_library
from eemicrogpt_core.kit.abi_contract import UNSUPPORTED, NativeAbiContract, raw_shape


class Envelope:
    """d_model 64-1024 in steps of 16 with every head count the ABI allows, at the ABI's bounds of the rest;
    nothing else."""

    def test_supports_every_shape_of_the_envelope(self, lib: Any) -> None:
        for d, layers, vocab, context in itertools.product(range(64, 1025, 16), (1, 12), (2, 256), (1, 256)):
            for heads in (h for h in range(1, d // 4 + 1) if d % h == 0):
                assert lib.emg_supports(raw_shape(d, heads, layers, vocab, context)) == 1, (d, heads, layers)

    def test_refuses_widths_outside_the_envelope(self, lib: Any) -> None:
        out = _ffi().new("emg_session **")
        for d in (16, 32, 48, 72, 120, 1000):  # below 64, not a multiple of 16 (above 1024: the ABI kit)
            shape = raw_shape(d, 4, 1, 27, 16)
            assert lib.emg_supports(shape) == 0, d
            assert lib.emg_create(shape, 1, out) == UNSUPPORTED, d


class TestSme2F16Abi(Envelope, NativeAbiContract):
    backend_name = "sme2_f16"

    def library_path(self) -> Path | None:
        return find_library(PACKAGE_DIR, sme2_f16.backend.stem)


class TestSme2F16wAbi(Envelope, NativeAbiContract):
    backend_name = "sme2_f16w"

    def library_path(self) -> Path | None:
        return find_library(PACKAGE_DIR, sme2_f16w.backend.stem)
