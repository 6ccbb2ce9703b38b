/* FP32 FMA and bf16 dot-product peak microbenchmarks and a hook to test the vectorised exp (extras beyond the
 * ABI). */
#include <time.h>

#include "expf.h"
#ifdef EMG_BF16
#include <immintrin.h>
#ifdef EMG_BF16_EMULATE
#include "bf16_emulate.h"
#endif
#endif

#define CHAINS 16 /* independent accumulators: > FMA latency x FMA ports, so the pipes never wait */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs FMAs on CHAINS register chains for about `seconds`; returns GFLOP/s (2 flops per lane per FMA). */
__attribute__((visibility("default"))) double emg_x86_peak_gflops(double seconds) {
    vf acc[CHAINS];
    for (int i = 0; i < CHAINS; i++) acc[i] = v_set1(1.0f + 1e-3f * (float)i);
    const vf a = v_set1(0.999999f), b = v_set1(1e-7f);
    const long inner = 4096;
    long rounds = 0;
    double start = now(), elapsed;
    do {
        for (long r = 0; r < inner; r++)
#pragma GCC unroll 16
            for (int i = 0; i < CHAINS; i++) acc[i] = v_fma(acc[i], a, b);
        rounds++;
        elapsed = now() - start;
    } while (elapsed < seconds);
    vf sum = v_zero();
    for (int i = 0; i < CHAINS; i++) sum = v_add(sum, acc[i]);
    volatile float sink = v_hsum(sum); /* keep the chains alive */
    (void)sink;
    return 2.0 * VW * CHAINS * (double)inner * (double)rounds / elapsed / 1e9;
}

#ifdef EMG_BF16
/* Runs VDPBF16PS on CHAINS register chains for about `seconds`; returns GFLOP/s counting 2 flops per bf16
 * multiply-add (an instruction does 32 of them: two per fp32 lane), as the FMA peak counts its lanes. The
 * same chain structure as the FMA peak, so the two figures compare the units, not the loops. */
__attribute__((visibility("default"))) double emg_x86_bf16_peak_gflops(double seconds) {
    __m512 acc[CHAINS];
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps(1.0f + 1e-3f * (float)i);
    const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.999f), _mm512_set1_ps(0.998f));
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-7f), _mm512_set1_ps(2e-7f));
    const long inner = 4096;
    long rounds = 0;
    double start = now(), elapsed;
    do {
        for (long r = 0; r < inner; r++)
#pragma GCC unroll 16
            for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        rounds++;
        elapsed = now() - start;
    } while (elapsed < seconds);
    __m512 sum = _mm512_setzero_ps();
    for (int i = 0; i < CHAINS; i++) sum = _mm512_add_ps(sum, acc[i]);
    volatile float sink = _mm512_reduce_add_ps(sum); /* keep the chains alive */
    (void)sink;
    return 2.0 * 32 * CHAINS * (double)inner * (double)rounds / elapsed / 1e9;
}
#endif

/* y[i] = exp(x[i]) through the kernels' v_exp (n a multiple of VW); lets the tests measure its error. */
__attribute__((visibility("default"))) void emg_x86_exp(const float *x, float *y, int n) {
    for (int i = 0; i + VW <= n; i += VW) v_store(y + i, v_exp(v_load(x + i)));
}
