/* RMS norm without gain, one row of n floats: y = x * r with r = 1 / sqrt(mean(x^2) + eps), and its
 * backward pass. */
#ifndef EMG_RMSNORM_H
#define EMG_RMSNORM_H

#include "eemicrogpt.h"
#include "neon_math.h"

/* Writes y and returns r (kept for the backward pass). */
EMG_INLINE float rmsnorm_forward(float *restrict y, const float *restrict x, int n) {
    const float r = 1.0f / sqrtf(dot_f32(x, x, n) / (float)n + EMG_RMS_EPS);
    const float32x4_t rv = vdupq_n_f32(r);
    for (int i = 0; i < n; i += 4) vst1q_f32(y + i, vmulq_f32(vld1q_f32(x + i), rv));
    return r;
}

/* out = base + r * (dy - y * mean(dy * y)); base may be NULL (then 0). out may alias base. */
EMG_INLINE void rmsnorm_backward(float *out, const float *base, const float *restrict dy,
                                 const float *restrict y, float r, int n) {
    const float32x4_t mean = vdupq_n_f32(dot_f32(dy, y, n) / (float)n);
    const float32x4_t rv = vdupq_n_f32(r);
    for (int i = 0; i < n; i += 4) {
        const float32x4_t g = vmulq_f32(rv, vfmsq_f32(vld1q_f32(dy + i), vld1q_f32(y + i), mean));
        vst1q_f32(out + i, base ? vaddq_f32(vld1q_f32(base + i), g) : g);
    }
}

#endif
