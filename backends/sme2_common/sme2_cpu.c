/*
 * CPU capability checks. Built WITHOUT SME/SVE flags and kept in its own translation unit (no LTO):
 * it must run on any aarch64 CPU, so no SME instruction may be scheduled before the feature tests.
 * The streaming vector length comes from the kernel (prctl) or sysctl, never from RDSVL.
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

int emg_sme_svl_bytes(void) {
    return emg_sme_cpu_status(0) == SME_CPU_OK ? sysctl_int("hw.optional.arm.sme_max_svl_b") : 0;
}

#elif defined(__linux__)
#include <sys/auxv.h>
#include <sys/prctl.h>

/* Bookworm's uapi headers predate these bits. */
#define EMG_HWCAP2_SME2 (1UL << 37)
#define EMG_HWCAP2_SME_F16F16 (1UL << 42)
#define EMG_PR_SME_GET_VL 64
#define EMG_PR_SME_VL_LEN_MASK 0xffff

int emg_sme_cpu_status(int need_f16f16) {
    const unsigned long hwcap2 = getauxval(AT_HWCAP2);
    if (!(hwcap2 & EMG_HWCAP2_SME2)) return SME_CPU_NO_SME2;
    if (need_f16f16 && !(hwcap2 & EMG_HWCAP2_SME_F16F16)) return SME_CPU_NO_F16F16;
    return SME_CPU_OK;
}

int emg_sme_svl_bytes(void) {
    if (emg_sme_cpu_status(0) != SME_CPU_OK) return 0;
    const int vl = prctl(EMG_PR_SME_GET_VL, 0, 0, 0, 0);
    return vl < 0 ? 0 : (vl & EMG_PR_SME_VL_LEN_MASK);
}

#else
int emg_sme_cpu_status(int need_f16f16) {
    (void)need_f16f16;
    return SME_CPU_NO_SME2;
}
int emg_sme_svl_bytes(void) { return 0; }
#endif
