"""setup() keyword arguments for an SME2 backend, built natively on aarch64 Linux or macOS (or cross-built
by the aarch64 lane through the same code).

Imported by backends/sme2_f32/setup.py and backends/sme2_f16/setup.py so that both packages build the same
sources with the same flags; the build command itself (feature test, strict linking, object check, arm64
only on universal2 Pythons) is ../arm_common/arm_setup.py, shared with neon. Only sme2_gemm.c may see the
SME extensions: the step is plain C (no SVE may leak into non-streaming code: Apple M4 has none) and the
CPU probe must run on any aarch64 CPU, so those two are compiled separately and linked in as objects.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "arm_common"))
from arm_setup import ArmBuildExt, ArmExtension, ObjCheck, is_arm_target  # noqa: E402

INCLUDE = os.environ.get("EEMICROGPT_INCLUDE", str(HERE.parent.parent / "eemicrogpt_core" / "include"))
WARN = ["-std=c11", "-fvisibility=hidden", "-Wall", "-Wextra"]
# Not armv9-a: that lets clang auto-vectorise ordinary code with SVE, which Apple M4 lacks outside
# streaming mode. The step gets no SME/SVE; the probe is built for the oldest aarch64.
PLAIN = {"sme2_step.c": ["-O3", "-march=armv8.7-a"], "sme2_cpu.c": ["-O2", "-march=armv8-a"]}


def sme_arch(f16: bool) -> str:
    return "-march=armv8.7-a+sme2" + ("+sme-f16f16" if f16 else "")


def feature_test(f16: bool) -> str:
    """A C unit using each SME construct the kernels rely on; it must not see SVE (Apple has none)."""
    mopa = (
        "svmopa_za16_f16_m(0, p16, p16, svld1_f16(p16, h), svld1_f16(p16, h));\n"
        "    svst1_f16(p16, h, svget2(svread_hor_za16_f16_vg2(0, 0), 1));\n"
        "    svst1_f16(p16, h, svget2(svread_ver_za16_f16_vg2(0, 0), 0));"
        if f16 else
        "svmopa_za32_f32_m(0, p, p, svld1_f32(p, a), svld1_f32(p, a));\n"
        "    svst1_f32(p, a, svget4(svread_hor_za32_f32_vg4(0, 0), 1));\n"
        "    svst1_f32(p, a, svget4(svread_ver_za32_f32_vg4(0, 0), 2));"
    )
    return f"""#include <arm_sme.h>
#if defined(__ARM_FEATURE_SVE)
#error "this compiler enables SVE with +sme2 (gcc does): the kernels would run SVE outside streaming mode"
#endif
static inline __attribute__((always_inline)) void body(float *a, __fp16 *h) __arm_streaming __arm_inout("za") {{
    const svbool_t p = svwhilelt_b32(0, 4), p16 = svptrue_b16();
    (void)a; (void)p16; (void)h; (void)p;
    {mopa}
}}
__arm_locally_streaming __arm_new("za") void emg_feature_test(float *a, __fp16 *h) {{ body(a, h); }}
"""


def sme2_setup_kwargs(extension: str, f16: bool) -> dict[str, Any]:
    """The Extension and build command when building for aarch64; nothing elsewhere (a pure-Python install)."""
    if not is_arm_target():
        return {}
    ext = ArmExtension(
        extension,
        backend="sme2_f16" if f16 else "sme2_f32",
        sources=[str(HERE / "sme2_gemm.c")],
        plain={str(HERE / name): [*WARN, *flags] for name, flags in PLAIN.items()},
        include_dirs=[INCLUDE, str(HERE)],
        define_macros=[("EMG_SME_F16", "1" if f16 else "0")],
        depends=[str(HERE / "sme2_internal.h"), *(str(HERE / name) for name in PLAIN),
                 *(str(p) for p in Path(INCLUDE).glob("*.h"))],
        extra_compile_args=[*WARN, "-O3", sme_arch(f16)],
        libraries=["m"],
        feature_test=feature_test(f16),
        objcheck=ObjCheck(streaming_from=[HERE / "sme2_gemm.c"]),
        sme_runtime=True,
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": ArmBuildExt}}
