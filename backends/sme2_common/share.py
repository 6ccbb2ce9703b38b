"""The files an SME2 distribution shares with the other ARM backends, copied into it so that its sdist builds
on its own.

Run by backends/sme2_f32/setup.py and backends/sme2_f16/setup.py in a repository checkout (an unpacked sdist
already holds the copies, and has no sibling directories to copy from): the build helpers, the kernels'
C sources, the core's ABI headers and its version go to `_build/` (read by setup.py only: in the sdist, not
in the wheel); the runtime modules go into the package, where the plugin imports them. A copy is rewritten
only when its content changed, so incremental builds stay incremental. The copies are not committed
(each distribution's .gitignore): edit the originals.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_DIR = "_build"
# repository path -> name in the distribution's _build/
BUILD_FILES = {
    "backends/lockstep.py": "lockstep.py",
    "backends/arm_common/arm_setup.py": "arm_setup.py",
    "backends/arm_common/a64_objcheck.py": "a64_objcheck.py",
    "backends/sme2_common/sme2_setup.py": "sme2_setup.py",
    "backends/sme2_common/sme2_step.c": "sme2_step.c",
    "backends/sme2_common/sme2_gemm.c": "sme2_gemm.c",
    "backends/sme2_common/sme2_cpu.c": "sme2_cpu.c",
    "backends/sme2_common/sme2_internal.h": "sme2_internal.h",
    "eemicrogpt_core/include/eemicrogpt.h": "include/eemicrogpt.h",
    "eemicrogpt_core/include/emg_backend.h": "include/emg_backend.h",
    "eemicrogpt_core/_version.py": "_version.py",
}
# repository path -> module name in the distribution's package
PACKAGE_FILES = {
    "backends/sme2_common/sme2_probe.py": "probe.py",
    "backends/sme2_common/sme2_spec.py": "spec.py",
}


def _write_if_changed(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def share(project: Path, package: str) -> None:
    """Refresh the copies in the distribution at `project` whose Python package is `package`."""
    for source, name in BUILD_FILES.items():
        _write_if_changed(project / BUILD_DIR / name, (REPO / source).read_text(encoding="utf-8"))
    for source, name in PACKAGE_FILES.items():
        note = f"# Copied from {source} by setup.py (sme2_common/share.py): edit that file, not this copy.\n"
        _write_if_changed(project / package / name, note + (REPO / source).read_text(encoding="utf-8"))
