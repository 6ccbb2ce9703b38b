/* RMS norm without gain over rows of d floats (d a multiple of 4; of 16 with dot chains 4), forward and
 * backward, shared by the ARM backends: y = x * r with r = 1 / sqrt(mean(x^2) + eps). `chains` (a constant)
 * picks dot_f32's summation order: each backend keeps its own, so its results do not move. */
#ifndef EMG_ARM_RMSNORM_H
#define EMG_ARM_RMSNORM_H

#include <arm_neon.h>
#include <math.h>

#include "arm_neon_math.h"
#include "eemicrogpt.h"

/* y = x * r per row, r[row] = 1 / rms(x[row]) (kept for the backward pass). */
EMG_INLINE void rmsnorm_forward(float *restrict y, float *restrict r, const float *restrict x, int rows, int d,
                                const int chains) {
    for (int n = 0; n < rows; n++) {
        const float *xn = x + (long)n * d;
        const float rn = 1.0f / sqrtf(dot_f32(xn, xn, d, chains) / (float)d + EMG_RMS_EPS);
        r[n] = rn;
        for (int i = 0; i < d; i += 4) vst1q_f32(y + (long)n * d + i, vmulq_n_f32(vld1q_f32(xn + i), rn));
    }
}

/* dx = base + r * (dy - y * mean(dy * y)) per row; base may be NULL (then 0). dx may alias base or dy. */
EMG_INLINE void rmsnorm_backward(float *dx, const float *base, const float *dy, const float *restrict y,
                                 const float *restrict r, int rows, int d, const int chains) {
    for (int n = 0; n < rows; n++) {
        const long o = (long)n * d;
        const float mean = dot_f32(dy + o, y + o, d, chains) / (float)d;
        for (int i = 0; i < d; i += 4) {
            const float32x4_t dv = vld1q_f32(dy + o + i), yv = vld1q_f32(y + o + i);
            float32x4_t v = vmulq_n_f32(vfmsq_n_f32(dv, yv, mean), r[n]);
            if (base) v = vaddq_f32(vld1q_f32(base + o + i), v);
            vst1q_f32(dx + o + i, v);
        }
    }
}

#endif /* EMG_ARM_RMSNORM_H */
