"""Run by the emulated Python: does the registry see what the lane expects under this QEMU_CPU?

    python check_backends.py --require neon,sme2_f32 --unavailable sme2_f16

Prints every backend with its status; exits 1 when a required backend is unavailable or an expected-
unavailable one is available. For an unavailable backend it also checks that asking for it by name fails
with its probe's reason and lists the available backends (what `eemicrogpt train --backend X` shows).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

from eemicrogpt_core.backends.registry import load_registry
from eemicrogpt_core.base.errors import BackendSelectionError
from eemicrogpt_core.model.shape import ModelShape


def names(csv: str) -> list[str]:
    return [n.strip() for n in csv.split(",") if n.strip()]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--require", default="", help="comma list of backends that must be available")
    parser.add_argument("--unavailable", default="", help="comma list of backends that must be unavailable")
    args = parser.parse_args()
    registry = load_registry()
    print(f"machine {platform.machine()}, QEMU_CPU={os.environ.get('QEMU_CPU', '?')}")
    for entry in registry.entries:
        state = "available" if entry.available else "unavailable"
        print(f"  {entry.name:<12} {state:<11} {entry.status_reason}")
    for failure in registry.failures:
        print(f"  broken plugin {failure.plugin} ({failure.distribution}): {failure.error}")

    problems = []
    for name in names(args.require):
        entry = registry.get(name)
        if entry is None or not entry.available:
            problems.append(f"{name} must be available: {entry.status_reason if entry else 'not installed'}")
    for name in names(args.unavailable):
        entry = registry.get(name)
        if entry is None:
            problems.append(f"{name} is not installed (expected installed but unavailable)")
            continue
        if entry.available:
            problems.append(f"{name} must be unavailable under this CPU but its probe says available")
            continue
        try:
            registry.select(name, ModelShape(64, 4), 16)
            problems.append(f"selecting {name} by name succeeded although it is unavailable")
        except BackendSelectionError as exc:
            message = str(exc)
            print(f"  --backend {name}: {message}")
            if entry.status_reason not in message or "Available here" not in message:
                problems.append(f"selecting {name} fails without its reason or the available list: {message}")
    for problem in problems:
        print(f"a64lane: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
