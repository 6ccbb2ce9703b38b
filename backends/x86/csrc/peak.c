/* FP32 FMA peak microbenchmark and a hook to test the vectorised exp (extras beyond the ABI). */
#include <time.h>

#include "expf.h"

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

/* y[i] = exp(x[i]) through the kernels' v_exp (n a multiple of VW); lets the tests measure its error. */
__attribute__((visibility("default"))) void emg_x86_exp(const float *x, float *y, int n) {
    for (int i = 0; i + VW <= n; i += VW) v_store(y + i, v_exp(v_load(x + i)));
}
