"""setup() keyword arguments for an SME2 backend, built natively on aarch64 Linux or macOS (or cross-built
by the aarch64 lane through the same code).

Used by backends/sme2_f32/setup.py and backends/sme2_f16/setup.py (sme2_f16 and sme2_f16w) from the copy
../share.py puts in their `_build/`, beside the kernels' sources, the ABI headers, the Neon helpers shared with
neon (`arm_common/`) and arm_setup.py (the build
command shared with neon: feature test, strict linking, object check, arm64 only on universal2 Pythons), so
that every SME2 library is built from the same sources with the same flags; tools/a64lane/darwin_compile.py
loads this original with ../arm_common on sys.path. Only sme2_gemm.c may see the SME extensions: the step is
plain C (no SVE may leak into non-streaming code: Apple M4 has none) and the CPU probe must run on any
aarch64 CPU, so those two are compiled separately and linked in as objects.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from arm_setup import ArmBuildExt, ArmExtension, ObjCheck, is_arm_target  # beside this file, or on sys.path

HERE = Path(__file__).resolve().parent
# The ABI headers: $EEMICROGPT_INCLUDE, the copy beside this file (a distribution's _build/), or the
# repository's (this file in backends/sme2_common).
INCLUDE = os.environ.get("EEMICROGPT_INCLUDE") or str(
    HERE / "include" if (HERE / "include").is_dir() else HERE.parents[1] / "eemicrogpt_core" / "include")
# The Neon helpers shared with the neon backend: the copy beside this file, or the repository's.
ARM_COMMON = str(HERE / "arm_common" if (HERE / "arm_common").is_dir() else HERE.parent / "arm_common" / "csrc")
WARN = ["-std=c11", "-fvisibility=hidden", "-Wall", "-Wextra"]
# Not armv9-a: that lets clang auto-vectorise ordinary code with SVE, which Apple M4 lacks outside
# streaming mode. The step gets no SME/SVE; the probe is built for the oldest aarch64.
PLAIN = {"sme2_step.c": ["-O3", "-march=armv8.7-a"], "sme2_cpu.c": ["-O2", "-march=armv8-a"]}


class Variant(NamedTuple):  # not a dataclass: tools/a64lane/darwin_compile.py loads this file unregistered
    """One SME2 build of the shared sources: which FMOPA its kernels use."""

    f16: bool  # fp16 GEMM operands (fp32 otherwise)
    widen: bool = False  # fp16 operands into za32 (widening FMOPA, base SME) instead of za16 (FEAT_SME_F16F16)

    @property
    def arch(self) -> str:
        return "-march=armv8.7-a+sme2" + ("+sme-f16f16" if self.f16 and not self.widen else "")

    @property
    def macros(self) -> list[tuple[str, str]]:
        return [("EMG_SME_F16", str(int(self.f16))), ("EMG_SME_F16_WIDEN", str(int(self.widen)))]


# Backend name -> build. sme2_f16w is compiled without +sme-f16f16, so no F16F16 instruction can reach it.
VARIANTS = {
    "sme2_f32": Variant(f16=False),
    "sme2_f16": Variant(f16=True),
    "sme2_f16w": Variant(f16=True, widen=True),
}


def feature_test(variant: Variant) -> str:
    """A C unit using each SME construct the kernels rely on; it must not see SVE (Apple has none)."""
    if variant.widen:
        mopa = (
            "svmopa_za32_f16_m(0, p16, p16, svzip1_f16(svld1_f16(p16, h), svld1_f16(p16, h)), svld1_f16(p16, h));\n"
            "    svst1_f32(p, a, svget4(svread_hor_za32_f32_vg4(0, 0), 1));\n"
            "    svst1_f32(p, a, svget4(svread_ver_za32_f32_vg4(0, 0), 2));"
        )
    elif variant.f16:
        mopa = (
            "svmopa_za16_f16_m(0, p16, p16, svld1_f16(p16, h), svld1_f16(p16, h));\n"
            "    svst1_f16(p16, h, svget2(svread_hor_za16_f16_vg2(0, 0), 1));\n"
            "    svst1_f16(p16, h, svget2(svread_ver_za16_f16_vg2(0, 0), 0));"
        )
    else:
        mopa = (
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


def sme2_extension(extension: str, backend: str) -> ArmExtension:
    """The Extension building `backend` (a VARIANTS key) as the library module `extension`."""
    variant = VARIANTS[backend]
    return ArmExtension(
        extension,
        backend=backend,
        sources=[str(HERE / "sme2_gemm.c")],
        plain={str(HERE / name): [*WARN, *flags] for name, flags in PLAIN.items()},
        include_dirs=[INCLUDE, str(HERE), ARM_COMMON],
        define_macros=variant.macros,
        depends=[str(HERE / "sme2_internal.h"), *(str(HERE / name) for name in PLAIN),
                 *(str(p) for p in Path(INCLUDE).glob("*.h")), *(str(p) for p in Path(ARM_COMMON).glob("*.h"))],
        extra_compile_args=[*WARN, "-O3", variant.arch],
        libraries=["m"],
        feature_test=feature_test(variant),
        objcheck=ObjCheck(streaming_from=[HERE / "sme2_gemm.c"]),
        sme_runtime=True,
    )


def sme2_setup_kwargs(**extensions: str) -> dict[str, Any]:
    """The Extensions (backend name=library module) and build command when building for aarch64; nothing
    elsewhere (a pure-Python install)."""
    if not is_arm_target():
        return {}
    return {"ext_modules": [sme2_extension(module, backend) for backend, module in extensions.items()],
            "cmdclass": {"build_ext": ArmBuildExt}}
