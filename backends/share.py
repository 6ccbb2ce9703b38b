"""The files a backend distribution shares with the rest of the repository, copied into it so that its sdist
builds on its own.

Run by every in-repository backend's setup.py (backends/<dir>/setup.py) in a repository checkout; an unpacked
sdist already holds the copies, and has no sibling directories to copy from. What goes to `_build/` (read by
setup.py only: in the sdist through MANIFEST.in, not in the wheel): lockstep.py and the core's version it
reads, and as a backend needs them the core's ABI headers, the ARM build helpers, the Neon helpers the ARM
kernels share (arm_common/csrc), the SME2 kernels' C sources. The runtime modules (the SME2 probe and spec) go
into the package, where the plugin imports them.
A copy is rewritten only when its content changed, so incremental builds stay incremental. The copies are
not committed (each distribution's .gitignore): edit the originals.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
BUILD_DIR = "_build"

# repository path -> name in a distribution's _build/
LOCKSTEP = {  # every backend: its version and core pin
    "backends/lockstep.py": "lockstep.py",
    "eemicrogpt_core/_version.py": "_version.py",
}
ABI_HEADERS = {  # every native backend
    "eemicrogpt_core/include/eemicrogpt.h": "include/eemicrogpt.h",
    "eemicrogpt_core/include/emg_backend.h": "include/emg_backend.h",
}
ARM_BUILD = {  # the ARM backends' build command
    "backends/arm_common/arm_setup.py": "arm_setup.py",
    "backends/arm_common/a64_objcheck.py": "a64_objcheck.py",
}
ARM_KERNELS = {  # the Neon helpers the ARM backends' kernels share (exp, dot products, RMS norm, Adam)
    "backends/arm_common/csrc/arm_neon_math.h": "arm_common/arm_neon_math.h",
    "backends/arm_common/csrc/arm_rmsnorm.h": "arm_common/arm_rmsnorm.h",
    "backends/arm_common/csrc/arm_adam.h": "arm_common/arm_adam.h",
}
SME2_BUILD = {  # the SME2 kernels, built by every SME2 distribution from these same sources
    "backends/sme2_common/sme2_setup.py": "sme2_setup.py",
    "backends/sme2_common/sme2_step.c": "sme2_step.c",
    "backends/sme2_common/sme2_gemm.c": "sme2_gemm.c",
    "backends/sme2_common/sme2_cpu.c": "sme2_cpu.c",
    "backends/sme2_common/sme2_internal.h": "sme2_internal.h",
}
# repository path -> module name in a distribution's package
SME2_PACKAGE = {
    "backends/sme2_common/sme2_probe.py": "probe.py",
    "backends/sme2_common/sme2_spec.py": "spec.py",
}


class Shared(NamedTuple):
    """What one distribution copies in."""

    build: dict[str, str]  # into _build/
    package: dict[str, str]  # into its Python package


# backend directory (backends/<dir>) -> what its distribution shares
BACKENDS = {
    "numpy_ref": Shared(LOCKSTEP, {}),
    "x86": Shared({**LOCKSTEP, **ABI_HEADERS}, {}),
    "neon": Shared({**LOCKSTEP, **ABI_HEADERS, **ARM_BUILD, **ARM_KERNELS}, {}),
    "sme2_f32": Shared({**LOCKSTEP, **ABI_HEADERS, **ARM_BUILD, **ARM_KERNELS, **SME2_BUILD}, SME2_PACKAGE),
    "sme2_f16": Shared({**LOCKSTEP, **ABI_HEADERS, **ARM_BUILD, **ARM_KERNELS, **SME2_BUILD}, SME2_PACKAGE),
}


def _write_if_changed(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def share(project: Path, package: str = "") -> None:
    """Refresh the copies in the distribution at `project` (backends/<dir>); `package` names its Python package,
    needed only when it takes runtime modules."""
    shared = BACKENDS[project.name]
    if shared.package and not package:
        raise ValueError(f"{project.name} copies modules into its package: name the package")
    for source, name in shared.build.items():
        _write_if_changed(project / BUILD_DIR / name, (REPO / source).read_text(encoding="utf-8"))
    for source, name in shared.package.items():
        note = f"# Copied from {source} by setup.py (backends/share.py): edit that file, not this copy.\n"
        _write_if_changed(project / package / name, note + (REPO / source).read_text(encoding="utf-8"))
