"""The shared native ABI contract (eemicrogpt_core.kit.abi_contract): example_c inherits it from emg_backend.h.

Plus example_c's own envelope: every valid shape whose parameter count fits an int.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from eemicrogpt_backend_example_c.plugin import LIBRARY_STEM, PACKAGE_DIR

from eemicrogpt_core.backends.native import _ffi, find_library
from eemicrogpt_core.kit.abi_contract import UNSUPPORTED, NativeAbiContract, raw_shape


class TestExampleCAbi(NativeAbiContract):
    backend_name = "example_c"

    def library_path(self) -> Path | None:
        return find_library(PACKAGE_DIR, LIBRARY_STEM)

    def test_supports_every_shape_of_the_envelope(self, lib: Any) -> None:
        widths = range(16, 257, 16)
        for d, layers, vocab, context in itertools.product(widths, range(1, 9), (2, 27, 256), (1, 16, 64)):
            for heads in (h for h in range(1, d // 4 + 1) if d % h == 0):
                assert lib.emg_supports(raw_shape(d, heads, layers, vocab, context)) == 1, (d, heads, layers)

    def test_supports_widths_outside_the_envelope(self, lib: Any) -> None:
        for d, heads in ((4, 1), (8, 2), (24, 6), (100, 5), (4720, 8)):
            assert lib.emg_supports(raw_shape(d, heads, 8, 256, 64)) == 1, d

    def test_refuses_more_parameters_than_an_int_indexes(self, lib: Any) -> None:
        out = _ffi().new("emg_session **")
        for d in (4736, 1 << 16, 1 << 30):  # 4736 at 8 layers: just over 2^31 - 1 parameters
            shape = raw_shape(d, d // 8, 8, 256, 64)
            assert lib.emg_supports(shape) == 0, d
            assert lib.emg_create(shape, 1, out) == UNSUPPORTED, d
