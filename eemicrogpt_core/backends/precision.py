"""Compute precisions a backend can declare, and the rule that picks one.

A backend's `BackendSpec.precision` names the precision its matrix products compute in (master weights
and Adam state stay fp32 in every backend here). `auto` only ever picks among backends of the requested
precision, fp32 unless the user asks otherwise, so reduced precision is never chosen silently: it is
chosen by the `precision` setting (config key, `--precision`) or by naming a reduced-precision backend.
"""

from __future__ import annotations

FP32 = "fp32"
PRECISIONS: tuple[str, ...] = (FP32, "bf16", "fp16")  # the values the `precision` setting accepts
DEFAULT_PRECISION = FP32  # what `auto` picks when the user does not say


def wanted(requested: str | None) -> str:
    """The precision `auto` must pick: the user's choice, else fp32."""
    return requested or DEFAULT_PRECISION
