"""The shared native ABI contract (eemicrogpt_core.kit.abi_contract): example_c inherits it from emg_backend.h.

Plus example_c's own envelope: every valid shape.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from eemicrogpt_backend_example_c.plugin import LIBRARY_STEM, PACKAGE_DIR

from eemicrogpt_core.backends.native import find_library
from eemicrogpt_core.base.abi import D_MODEL_STEP, MAX_CONTEXT, MAX_D_MODEL, MAX_LAYERS
from eemicrogpt_core.kit.abi_contract import NativeAbiContract, raw_shape


class TestExampleCAbi(NativeAbiContract):
    backend_name = "example_c"

    def library_path(self) -> Path | None:
        return find_library(PACKAGE_DIR, LIBRARY_STEM)

    def test_supports_every_valid_shape(self, lib: Any) -> None:
        """The ABI's whole range: every width step to 1024, 1-12 layers, context up to 256."""
        widths = range(D_MODEL_STEP, MAX_D_MODEL + 1, D_MODEL_STEP)
        for d, layers, vocab, context in itertools.product(widths, range(1, MAX_LAYERS + 1), (2, 27, 256),
                                                           (1, 64, MAX_CONTEXT)):
            for heads in (h for h in range(1, d // 4 + 1) if d % h == 0):
                assert lib.emg_supports(raw_shape(d, heads, layers, vocab, context)) == 1, (d, heads, layers)

    def test_supports_widths_between_the_steps(self, lib: Any) -> None:
        for d, heads in ((4, 1), (8, 2), (24, 6), (100, 5), (1020, 5)):
            assert lib.emg_supports(raw_shape(d, heads, MAX_LAYERS, 256, MAX_CONTEXT)) == 1, d
