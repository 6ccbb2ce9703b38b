"""Load a native backend library (the ABI in include/eemicrogpt.h) with cffi and adapt it to a session.

A native backend package is C sources, a build file and a few lines of Python calling
`native_session_factory(path_to_library)`. Arrays are validated by the core before they get here; this
module additionally checks dtype, contiguity and sizes so that nothing malformed can reach C.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cffi
import numpy as np

from ..base.abi import (
    ABI_VERSION,
    LENGTH_DTYPE,
    TOKEN_DTYPE,
    get_include,
    header_constant,
    header_text,
    status_codes,
)
from ..base.errors import NonFiniteError
from ..model.optim import OptimizerSettings
from ..model.shape import ModelShape
from .backend import BackendSession, SessionFactory, TrainState

__all__ = [
    "ABI_VERSION",
    "NativeBackendError",
    "NativeNonFiniteError",
    "find_library",
    "get_include",
    "header_constant",
    "header_text",
    "library_supports",
    "native_session_factory",
]

STATUS = status_codes()  # enum emg_status, read from the header
_STATUS_MESSAGES = {
    STATUS["EMG_ERR_ARGUMENT"]: "invalid argument",
    STATUS["EMG_ERR_UNSUPPORTED"]: "unsupported shape or CPU",
    STATUS["EMG_ERR_NOMEM"]: "out of memory",
    STATUS["EMG_ERR_NONFINITE"]: "non-finite loss or parameter",
}


class NativeBackendError(RuntimeError):
    """A native call returned a non-zero status."""

    def __init__(self, call: str, status: int) -> None:
        self.status = status
        super().__init__(f"{call} failed: {_STATUS_MESSAGES.get(status, 'unknown error')} (status {status})")


class NativeNonFiniteError(NativeBackendError, NonFiniteError):
    """EMG_ERR_NONFINITE: a loss, gradient or updated parameter is NaN or infinite."""


# Probes run in worker threads (plugin_guard), so two first calls can race: one lock makes sure there is
# only ever one FFI instance, and one dlopen per library through it (cffi refuses to mix instances).
_LOAD_LOCK = threading.RLock()


def _ffi() -> cffi.FFI:
    with _LOAD_LOCK:
        return _build_ffi()


@functools.cache
def _build_ffi() -> cffi.FFI:
    header = header_text()
    match = re.search(r"/\* CDEF-BEGIN \*/(.*?)/\* CDEF-END \*/", header, re.S)
    if match is None:
        raise RuntimeError("eemicrogpt.h lacks its CDEF-BEGIN/CDEF-END block")
    ffi = cffi.FFI()
    ffi.cdef(match.group(1))
    return ffi


def load_library(path: str) -> Any:
    """dlopen a backend library once per process and check its ABI version."""
    with _LOAD_LOCK:
        return _load_library(path)


@functools.cache
def _load_library(path: str) -> Any:
    ffi = _build_ffi()
    lib: Any = ffi.dlopen(path)  # its functions are the header's, declared at run time
    version = lib.emg_abi_version()  # the one function whose signature every ABI version shares
    if version != ABI_VERSION:
        raise RuntimeError(f"{Path(path).name} was built for native ABI version {version}; this eemicrogpt needs "
                           f"version {ABI_VERSION}: rebuild or upgrade the backend")
    return lib


def _check(call: str, status: int) -> None:
    if status == STATUS["EMG_ERR_NONFINITE"]:
        raise NativeNonFiniteError(call, status)
    if status != STATUS["EMG_OK"]:
        raise NativeBackendError(call, status)


def shape_struct(ffi: cffi.FFI, shape: ModelShape) -> Any:
    """An emg_shape for the library (owned by the returned cdata)."""
    return ffi.new("emg_shape *", {"d_model": shape.d_model, "n_heads": shape.n_heads, "n_layers": shape.n_layers,
                                   "vocab": shape.vocab, "context": shape.context})


def _require(array: np.ndarray, dtype: type, shape: tuple[int, ...], what: str) -> np.ndarray:
    if not isinstance(array, np.ndarray) or array.dtype != dtype or array.shape != shape:
        got = f"{getattr(array, 'dtype', type(array).__name__)} {getattr(array, 'shape', '')}"
        raise ValueError(f"{what} must be {np.dtype(dtype).name} {shape}, got {got}")
    if not array.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    return array


class NativeSession(BackendSession):
    def __init__(self, library_path: str, shape: ModelShape, max_batch: int) -> None:
        self._ffi = _ffi()
        self._lib = load_library(library_path)
        self.shape = shape
        self.max_batch = max_batch
        out = self._ffi.new("emg_session **")
        _check("emg_create", self._lib.emg_create(shape_struct(self._ffi, shape), max_batch, out))
        self._session = out[0]

    # (the ignore: cffi's stubs want a Buffer, and numpy's stubs call ndarray one only from Python 3.12)
    def _ptr(self, ctype: str, array: np.ndarray) -> Any:
        return self._ffi.cast(ctype, self._ffi.from_buffer(array))  # type: ignore[call-overload]

    def _live(self) -> Any:
        if self._session is None:
            raise RuntimeError("this backend session is closed")
        return self._session

    def set_state(self, state: TrainState) -> None:
        n = (self.shape.n_params,)
        params = _require(np.ascontiguousarray(state.params), np.float32, n, "params")
        m = _require(np.ascontiguousarray(state.adam_m), np.float32, n, "adam_m")
        v = _require(np.ascontiguousarray(state.adam_v), np.float32, n, "adam_v")
        status = self._lib.emg_set_state(
            self._live(), self._ptr("float *", params), self._ptr("float *", m),
            self._ptr("float *", v), int(state.step),
        )
        _check("emg_set_state", status)

    def get_state(self) -> TrainState:
        n = self.shape.n_params
        params, m, v = (np.empty(n, np.float32) for _ in range(3))
        step = self._ffi.new("int64_t *")
        status = self._lib.emg_get_state(
            self._live(), self._ptr("float *", params), self._ptr("float *", m),
            self._ptr("float *", v), step,
        )
        _check("emg_get_state", status)
        return TrainState(params, m, v, int(step[0]))

    def _batch_arrays(self, tokens: np.ndarray, lengths: np.ndarray, lead: tuple[int, ...]) -> int:
        if tokens.ndim != len(lead) + 2:
            raise ValueError(f"tokens must have {len(lead) + 2} dimensions, got shape {tokens.shape}")
        batch = tokens.shape[-2]
        _require(tokens, TOKEN_DTYPE, (*lead, batch, self.shape.seq_len), "tokens")
        _require(lengths, LENGTH_DTYPE, (*lead, batch), "lengths")
        if not 1 <= batch <= self.max_batch:
            raise ValueError(f"batch {batch} is outside 1..{self.max_batch} for this session")
        return batch

    def train_steps(self, tokens: np.ndarray, lengths: np.ndarray, lrs: np.ndarray) -> np.ndarray:
        n = tokens.shape[0] if tokens.ndim == 3 else -1
        batch = self._batch_arrays(tokens, lengths, (n,))
        _require(lrs, np.float32, (n,), "lrs")
        losses = np.empty(n, np.float32)
        status = self._lib.emg_train_steps(
            self._live(), n, batch, self._ptr("uint8_t *", tokens), self._ptr("uint16_t *", lengths),
            self._ptr("float *", lrs), self._ptr("float *", losses),
        )
        _check("emg_train_steps", status)
        return losses

    def loss_and_grads(
        self, tokens: np.ndarray, lengths: np.ndarray, want_grads: bool = True
    ) -> tuple[float, np.ndarray | None]:
        batch = self._batch_arrays(tokens, lengths, ())
        loss = self._ffi.new("float *")
        grads = np.empty(self.shape.n_params, np.float32) if want_grads else None
        grads_ptr = self._ptr("float *", grads) if grads is not None else self._ffi.NULL
        status = self._lib.emg_loss_and_grad(
            self._live(), batch, self._ptr("uint8_t *", tokens), self._ptr("uint16_t *", lengths),
            loss, grads_ptr,
        )
        _check("emg_loss_and_grad", status)
        return float(loss[0]), grads

    def set_optimizer(self, opt: OptimizerSettings) -> None:
        """Use these AdamW settings for every later step (emg_set_optimizer)."""
        settings = self._ffi.new("emg_optimizer *", {"beta1": opt.beta1, "beta2": opt.beta2, "eps": opt.eps,
                                                     "weight_decay": opt.weight_decay, "grad_clip": opt.grad_clip})
        _check("emg_set_optimizer", self._lib.emg_set_optimizer(self._live(), settings))

    def set_threads(self, n: int) -> int:
        """Run each step on n threads where the library exports emg_set_threads; returns the count in use."""
        try:
            set_threads = self._lib.emg_set_threads
        except AttributeError:  # an optional export: older or single-threaded libraries lack it
            return 1
        status = set_threads(self._live(), int(n))
        if status == STATUS["EMG_ERR_UNSUPPORTED"]:
            raise ValueError(f"this library cannot split a step across {n} threads")
        _check("emg_set_threads", status)
        return int(n)

    def close(self) -> None:
        if self._session is not None:
            self._lib.emg_destroy(self._session)
            self._session = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def find_library(package_dir: str | Path, stem: str) -> Path | None:
    """The shared library `stem*.so` (or .dylib) that a backend package built next to its Python files.

    setuptools names a built Extension `stem.cpython-311-x86_64-linux-gnu.so`; the aarch64 lane drops a
    cross-compiled `stem.so`. Returns None when none was built (e.g. the package was installed on a CPU
    it cannot serve).
    """
    directory = Path(package_dir)
    for pattern in (f"{stem}.*so", f"{stem}.so", f"{stem}.*dylib"):
        found = sorted(directory.glob(pattern))
        if found:
            return found[0]
    return None


def not_built_reason(package_dir: str | Path, stem: str) -> str | None:
    """Why the build left no library, as its setup.py wrote it (`<stem>.not-built.txt`), or None."""
    note = Path(package_dir) / f"{stem}.not-built.txt"
    return note.read_text().strip() if note.is_file() else None


def library_load_error(library_path: str | Path) -> str | None:
    """None when the library loads and speaks this ABI, otherwise why not (probes call this last, on a CPU
    they already checked: a missing runtime symbol must say so here, not at the first training step)."""
    try:
        load_library(str(library_path))
    except (OSError, RuntimeError, AttributeError) as exc:
        return f"{Path(library_path).name} does not load: {exc}"
    return None


def supports(library_path: str, shape: ModelShape) -> bool:
    return bool(load_library(library_path).emg_supports(shape_struct(_ffi(), shape)))


def library_supports(locate: Callable[[], str | Path | None]) -> Callable[[ModelShape], bool]:
    """A BackendSpec.supports that asks the library (emg_supports): the shapes are declared only by its kernels.

    `locate` returns the library's path, or None when it was not built (then nothing is supported; the probe
    says why). The registry asks only available backends, so the library is one this CPU can load.
    """

    def check(shape: ModelShape) -> bool:
        path = locate()
        return path is not None and supports(str(path), shape)

    return check


def native_session_factory(library_path: str | Path) -> SessionFactory:
    """A BackendSpec factory for the library at library_path (float32 only)."""

    def factory(shape: ModelShape, max_batch: int, dtype: str) -> BackendSession:
        if dtype != "float32":
            raise ValueError(f"native backends compute in float32, not {dtype}")
        return NativeSession(str(library_path), shape, max_batch)

    return factory
