/* RMS norm without a learned scale: y = x * r, r = 1 / sqrt(mean(x^2) + eps). The forward runs over a block
 * of rows in three passes (mean squares, the scales r for all rows as vectors, then y), so the square root
 * and the division run once per VW rows instead of as scalars per row. */
#ifndef EMG_X86_NORM_H
#define EMG_X86_NORM_H

#include <math.h>

#include "simd.h"
#include "eemicrogpt.h"

/* sum / D: for a power-of-two D multiplying by 1 / D gives the same float and is cheaper; other widths
 * divide, so the results are those of the per-row formula at every width. */
AI float rmsnorm_mean(const int D, float sum) { return (D & (D - 1)) == 0 ? sum * (1.0f / (float)D) : sum / (float)D; }

/* mean(x^2) of one D-wide row. */
AI float rmsnorm_mean_sq(const int D, const float *x) {
    vf ss = v_zero();
#pragma GCC unroll 8
    for (int i = 0; i < D; i += VW) ss = v_fma(v_load(x + i), v_load(x + i), ss);
    return rmsnorm_mean(D, v_hsum(ss));
}

/* In place for n rows: ms[p] = mean(x^2) of row p  ->  r[p] = 1 / sqrt(ms[p] + eps). */
AI void rmsnorm_scales(float *ms, const int n) {
    const vf eps = v_set1(EMG_RMS_EPS), one = v_set1(1.0f);
    int p = 0;
    for (; p + VW <= n; p += VW) v_store(ms + p, v_div(one, v_sqrt(v_add(v_load(ms + p), eps))));
    for (; p < n; p++) ms[p] = 1.0f / sqrtf(ms[p] + EMG_RMS_EPS);
}

/* y = x * r for one D-wide row (y may alias x); returns mean(y^2) (the next norm's input, when chained). */
AI float rmsnorm_apply(const int D, const float *x, const float r, float *y) {
    const vf rv = v_set1(r);
    vf ss = v_zero();
#pragma GCC unroll 8
    for (int i = 0; i < D; i += VW) {
        const vf yi = v_mul(v_load(x + i), rv);
        ss = v_fma(yi, yi, ss);
        v_store(y + i, yi);
    }
    return rmsnorm_mean(D, v_hsum(ss));
}

/* y[p] = rms(x[p]) for rows p < n (row stride D), keeping the scales in r[p]. */
AI void rmsnorm_forward(const int D, const float *x, int n, float *r, float *y) {
    for (int p = 0; p < n; p++) r[p] = rmsnorm_mean_sq(D, x + p * D);
    rmsnorm_scales(r, n);
    for (int p = 0; p < n; p++) (void)rmsnorm_apply(D, x + p * D, r[p], y + p * D);
}

/* One row: dx = base + r * (dy - y * mean(dy * y)); base may be NULL (then 0). dx may alias base. */
AI void rmsnorm_backward(const int D, const float *dy, const float *y, float r, const float *base, float *dx) {
    vf dot = v_zero();
#pragma GCC unroll 8
    for (int i = 0; i < D; i += VW) dot = v_fma(v_load(dy + i), v_load(y + i), dot);
    vf mean = v_set1(rmsnorm_mean(D, v_hsum(dot))), rv = v_set1(r);
#pragma GCC unroll 8
    for (int i = 0; i < D; i += VW) {
        vf g = v_mul(rv, v_fnma(v_load(y + i), mean, v_load(dy + i)));
        v_store(dx + i, base ? v_add(v_load(base + i), g) : g);
    }
}

#endif /* EMG_X86_NORM_H */
