/* CPU feature probe: CPUID + XGETBV. Compiled WITHOUT any -m target flags so that nothing in this
 * library can use an instruction the CPU lacks; it only reads what the CPU and OS report. */
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* Bits returned by emg_x86_cpu_features (the plugin's probe.py decodes them). */
enum {
    F_AVX = 1 << 0, F_FMA = 1 << 1, F_AVX2 = 1 << 2, F_AVX512F = 1 << 3, F_AVX512VL = 1 << 4,
    F_AVX512BW = 1 << 5, F_AVX512DQ = 1 << 6, F_OS_YMM = 1 << 7, F_OS_ZMM = 1 << 8, F_AVX512BF16 = 1 << 9,
    F_AMX_BF16 = 1 << 10, /* AMX-TILE and AMX-BF16 */
    F_OS_AMX = 1 << 11    /* the OS saves zmm and AMX tile state (XTILECFG, XTILEDATA) */
};

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

__attribute__((visibility("default"))) int emg_x86_cpu_features(void) {
    unsigned a, b, c, d;
    int f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int osxsave = (c >> 27) & 1;
    if ((c >> 28) & 1) f |= F_AVX;
    if ((c >> 12) & 1) f |= F_FMA;
    if (osxsave) {
        const uint64_t xcr0 = xgetbv0();
        if ((xcr0 & 0x6) == 0x6) f |= F_OS_YMM;            /* SSE + AVX state */
        if ((xcr0 & 0xE6) == 0xE6) f |= F_OS_ZMM;          /* + opmask, ZMM_Hi256, Hi16_ZMM */
        if ((xcr0 & 0x600E6) == 0x600E6) f |= F_OS_AMX;    /* + XTILECFG, XTILEDATA */
    }
    if (__get_cpuid_max(0, 0) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        if ((b >> 5) & 1) f |= F_AVX2;
        if ((b >> 16) & 1) f |= F_AVX512F;
        if ((b >> 17) & 1) f |= F_AVX512DQ;
        if ((b >> 30) & 1) f |= F_AVX512BW;
        if ((b >> 31) & 1) f |= F_AVX512VL;
        if (((d >> 22) & 1) && ((d >> 24) & 1)) f |= F_AMX_BF16;
        const unsigned subleaves = a; /* EAX of leaf 7 subleaf 0: the highest subleaf */
        if (subleaves >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            if ((a >> 5) & 1) f |= F_AVX512BF16;
        }
    }
    return f;
}
#else
__attribute__((visibility("default"))) int emg_x86_cpu_features(void) { return 0; }
#endif
