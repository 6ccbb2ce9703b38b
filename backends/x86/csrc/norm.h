/* RMS norm without a learned scale: y = x * r, r = 1 / sqrt(mean(x^2) + eps). */
#ifndef EMG_X86_NORM_H
#define EMG_X86_NORM_H

#include "simd.h"
#include "eemicrogpt.h"

/* y = x * r for one D-wide row; returns r (kept for the backward pass). */
AI float rms_fwd(const int D, const float *x, float *y) {
    vf ss = v_zero();
#pragma GCC unroll 8
    for (int i = 0; i < D; i += VW) ss = v_fma(v_load(x + i), v_load(x + i), ss);
    float r = 1.0f / sqrtf(v_hsum(ss) / (float)D + EMG_RMS_EPS);
    vf rv = v_set1(r);
#pragma GCC unroll 8
    for (int i = 0; i < D; i += VW) v_store(y + i, v_mul(v_load(x + i), rv));
    return r;
}

/* dx = base + r * (dy - y * mean(dy * y)); base may be NULL (then 0). dx may alias base. */
AI void rms_bwd(const int D, const float *dy, const float *y, float r, const float *base, float *dx) {
    vf dot = v_zero();
#pragma GCC unroll 8
    for (int i = 0; i < D; i += VW) dot = v_fma(v_load(dy + i), v_load(y + i), dot);
    vf mean = v_set1(v_hsum(dot) / (float)D), rv = v_set1(r);
#pragma GCC unroll 8
    for (int i = 0; i < D; i += VW) {
        vf g = v_mul(rv, v_fnma(v_load(y + i), mean, v_load(dy + i)));
        v_store(dx + i, base ? v_add(v_load(base + i), g) : g);
    }
}

#endif /* EMG_X86_NORM_H */
