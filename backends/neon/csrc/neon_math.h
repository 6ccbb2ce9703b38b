/* The neon backend's own Neon helpers; those it shares with the SME2 backends (EMG_INLINE, exp_f32x4,
 * dot_f32, sum4_f32x4) are in backends/arm_common/csrc/arm_neon_math.h. */
#ifndef EMG_NEON_MATH_H
#define EMG_NEON_MATH_H

#include <arm_neon.h>
#include <math.h>

#include "arm_neon_math.h"

/* In place: x[0..n) = softmax(x[0..n)); x must have room for n rounded up to a multiple of 4, and those
 * extra lanes are left at exactly 0 so they can be summed or multiplied without masking. When lse is not
 * NULL it receives log(sum(exp(x))) of the input (for the cross-entropy loss). */
EMG_INLINE void softmax_inplace(float *x, int n, float *lse) {
    int nv = (n + 3) / 4;
    for (int i = n; i < nv * 4; i++) x[i] = -1e30f;
    float32x4_t mx = vld1q_f32(x);
    for (int i = 1; i < nv; i++) mx = vmaxq_f32(mx, vld1q_f32(x + 4 * i));
    float m = vmaxvq_f32(mx);
    float32x4_t sum = vdupq_n_f32(0.0f);
    for (int i = 0; i < nv; i++) {
        float32x4_t e = exp_f32x4(vsubq_f32(vld1q_f32(x + 4 * i), vdupq_n_f32(m)), 6);
        vst1q_f32(x + 4 * i, e);
    }
    for (int i = n; i < nv * 4; i++) x[i] = 0.0f;
    for (int i = 0; i < nv; i++) sum = vaddq_f32(sum, vld1q_f32(x + 4 * i));
    float total = vaddvq_f32(sum);
    float32x4_t inv = vdupq_n_f32(1.0f / total);
    for (int i = 0; i < nv; i++) vst1q_f32(x + 4 * i, vmulq_f32(vld1q_f32(x + 4 * i), inv));
    if (lse) *lse = m + logf(total);
}

#endif /* EMG_NEON_MATH_H */
