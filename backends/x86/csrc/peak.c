/* FP32 FMA, bf16 dot-product and AMX tile peak microbenchmarks and a hook to test the vectorised exp (extras beyond the
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

/* The loops measure the units, not memory: instrumented (tests/run_sanitized.sh) the FMA loop measured a
 * seventh of the peak with AddressSanitizer and UBSan on, a third with UBSan alone. */
#define PEAK_LOOP __attribute__((visibility("default"), no_sanitize("address", "undefined")))

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs FMAs on CHAINS register chains for about `seconds`; returns GFLOP/s (2 flops per lane per FMA). */
PEAK_LOOP double emg_x86_peak_gflops(double seconds) {
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
PEAK_LOOP double emg_x86_bf16_peak_gflops(double seconds) {
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

#ifdef EMG_AMX
#include "gemm_amx.h"

/* Runs TDPBF16PS on the four accumulator tiles (16 x 16 fp32 each, so 2 x 4 tile products in flight cover the
 * instruction's latency) for about `seconds`; returns GFLOP/s counting 2 flops per bf16 multiply-add (16 x 16 x
 * 32 per instruction). 0 when the kernel does not grant AMX state. */
PEAK_LOOP double emg_x86_amx_peak_gflops(double seconds) {
    if (!amx_request()) return 0.0;
    uint16_t a[16 * 32] __attribute__((aligned(64))), b[16 * 32] __attribute__((aligned(64)));
    float out[16 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; i++) a[i] = 0x3F80, b[i] = 0x3580; /* bf16 1.0 and 2^-20 */
    amx_begin();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b, 64);
    const long inner = 1024;
    long rounds = 0;
    double start = now(), elapsed;
    do {
        for (long r = 0; r < inner; r++) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        rounds++;
        elapsed = now() - start;
    } while (elapsed < seconds);
    _tile_stored(0, out, 64);
    amx_end();
    volatile float sink = out[0]; /* keep the accumulators alive */
    (void)sink;
    return 2.0 * 16 * 16 * 32 * 4 * (double)inner * (double)rounds / elapsed / 1e9;
}
#endif

/* y[i] = exp(x[i]) through the kernels' v_exp (n a multiple of VW); lets the tests measure its error. */
__attribute__((visibility("default"))) void emg_x86_exp(const float *x, float *y, int n) {
    for (int i = 0; i + VW <= n; i += VW) v_store(y + i, v_exp(v_load(x + i)));
}
