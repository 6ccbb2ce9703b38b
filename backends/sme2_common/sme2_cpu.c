/*
 * CPU capability check. Built WITHOUT SME/SVE flags and kept in its own translation unit (no LTO):
 * it must run on any aarch64 CPU, so no SME instruction may be scheduled before the feature tests.
 * (The kernels are vector-length agnostic, so the streaming vector length is not checked here.)
 */
#include "sme2_internal.h"

#if defined(__APPLE__)
#include <stddef.h>
#include <sys/sysctl.h>

static int sysctl_int(const char *name) {
    int value = 0;
    size_t size = sizeof value;
    if (sysctlbyname(name, &value, &size, NULL, 0) != 0) return 0; /* a missing key means "no" */
    return value;
}

int emg_sme_cpu_status(int need_f16f16) {
    if (!sysctl_int("hw.optional.arm.FEAT_SME2")) return SME_CPU_NO_SME2;
    if (need_f16f16 && !sysctl_int("hw.optional.arm.FEAT_SME_F16F16")) return SME_CPU_NO_F16F16;
    return SME_CPU_OK;
}

#elif defined(__linux__)
#include <sys/auxv.h>

/* Bookworm's uapi headers predate these bits. */
#define EMG_HWCAP2_SME2 (1UL << 37)
#define EMG_HWCAP2_SME_F16F16 (1UL << 42)

int emg_sme_cpu_status(int need_f16f16) {
    const unsigned long hwcap2 = getauxval(AT_HWCAP2);
    if (!(hwcap2 & EMG_HWCAP2_SME2)) return SME_CPU_NO_SME2;
    if (need_f16f16 && !(hwcap2 & EMG_HWCAP2_SME_F16F16)) return SME_CPU_NO_F16F16;
    return SME_CPU_OK;
}

#else
int emg_sme_cpu_status(int need_f16f16) {
    (void)need_f16f16;
    return SME_CPU_NO_SME2;
}
#endif
