"""The native ABI's constants, read from include/eemicrogpt.h (the C side's values, read not copied).

Plain text parsing, no cffi: the model, the config and the loader all take their bounds from here.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from pathlib import Path

import numpy as np


def get_include() -> str:
    """The directory holding eemicrogpt.h, for building native backends against the ABI."""
    return str(resources.files("eemicrogpt_core") / "include")


@functools.cache
def header_text() -> str:
    return (Path(get_include()) / "eemicrogpt.h").read_text()


def header_constant(name: str) -> int:
    """The integer value of `#define name <int>` in eemicrogpt.h."""
    match = re.search(rf"^#define {re.escape(name)} (-?\d+)\b", header_text(), re.M)
    if match is None:
        raise RuntimeError(f"eemicrogpt.h does not define {name}")
    return int(match.group(1))


ABI_VERSION = header_constant("EMG_ABI_VERSION")
MIN_VOCAB = header_constant("EMG_MIN_VOCAB")
MAX_VOCAB = header_constant("EMG_MAX_VOCAB")
MAX_CONTEXT = header_constant("EMG_MAX_CONTEXT")
MAX_LAYERS = header_constant("EMG_MAX_LAYERS")
MAX_NATIVE_BATCH = header_constant("EMG_MAX_BATCH")  # the largest max_batch a native session accepts
MAX_D_MODEL = header_constant("EMG_MAX_D_MODEL")
D_MODEL_STEP = header_constant("EMG_D_MODEL_STEP")  # native libraries run multiples of this width

# The element types of a batch as the ABI takes it: tokens uint8 (a vocabulary has at most 256 symbols),
# lengths uint16 (a sequence holds up to MAX_CONTEXT + 1 = 257 tokens).
TOKEN_DTYPE = np.uint8
LENGTH_DTYPE = np.uint16


def status_codes() -> dict[str, int]:
    """The `enum emg_status` members and their values, from the header."""
    block = re.search(r"enum emg_status \{(.*?)\};", header_text(), re.S)
    if block is None:
        raise RuntimeError("eemicrogpt.h lacks enum emg_status")
    return {name: int(value) for name, value in re.findall(r"(EMG_\w+) = (\d+)", block.group(1))}
