/* Bias-corrected Adam over the flat parameter buffer with the ABI header's constants, four lanes at a time,
 * shared by the ARM backends: the same operations as eemicrogpt's optim.py in float32 (FMA for the moment
 * updates, IEEE sqrt and divide; the bias corrections in double, rounded once), about 5 instructions per
 * parameter instead of the ~32 of a scalar loop that libm's sqrtf keeps from vectorising. */
#ifndef EMG_ARM_ADAM_H
#define EMG_ARM_ADAM_H

#include <arm_neon.h>
#include <math.h>
#include <stdint.h>

#include "arm_neon_math.h"
#include "eemicrogpt.h"

/* How the second moment's (1 - beta2) g^2 is rounded (a constant; each backend keeps its own, so its
 * results do not move): ADAM_G2_SQUARE_FIRST (1 - beta2) * (g * g), the neon backend's;
 * ADAM_G2_SCALE_FIRST ((1 - beta2) * g) * g, the SME2 backends' (and the scalar tail's). */
enum { ADAM_G2_SQUARE_FIRST, ADAM_G2_SCALE_FIRST };

/* One update (the layer has counted it: step >= 1) of every parameter; any n. */
EMG_INLINE void adam_update(float *restrict params, const float *restrict grads, float *restrict m, float *restrict v,
                            long n, int64_t step, float lr, const int g2) {
    const float bc1 = (float)(1.0 - pow((double)EMG_ADAM_BETA1, (double)step));
    const float bc2 = (float)(1.0 - pow((double)EMG_ADAM_BETA2, (double)step));
    const float a1 = 1.0f - EMG_ADAM_BETA1, a2 = 1.0f - EMG_ADAM_BETA2; /* exact (Sterbenz) */
    const float32x4_t b1 = vdupq_n_f32(EMG_ADAM_BETA1), b2 = vdupq_n_f32(EMG_ADAM_BETA2);
    const float32x4_t vbc1 = vdupq_n_f32(bc1), vbc2 = vdupq_n_f32(bc2), eps = vdupq_n_f32(EMG_ADAM_EPS);
    const long n4 = n & ~3L;
    for (long i = 0; i < n4; i += 4) {
        const float32x4_t g = vld1q_f32(grads + i);
        const float32x4_t mi = vfmaq_n_f32(vmulq_f32(b1, vld1q_f32(m + i)), g, a1);
        const float32x4_t b2v = vmulq_f32(b2, vld1q_f32(v + i));
        const float32x4_t vi = g2 == ADAM_G2_SQUARE_FIRST ? vfmaq_n_f32(b2v, vmulq_f32(g, g), a2)
                                                          : vfmaq_f32(b2v, vmulq_n_f32(g, a2), g);
        vst1q_f32(m + i, mi);
        vst1q_f32(v + i, vi);
        const float32x4_t den = vaddq_f32(vsqrtq_f32(vdivq_f32(vi, vbc2)), eps);
        vst1q_f32(params + i, vsubq_f32(vld1q_f32(params + i), vdivq_f32(vmulq_n_f32(vdivq_f32(mi, vbc1), lr), den)));
    }
    for (long i = n4; i < n; i++) { /* idle while n_params is a multiple of d_model, so of 16 */
        m[i] = EMG_ADAM_BETA1 * m[i] + a1 * grads[i];
        v[i] = EMG_ADAM_BETA2 * v[i] + a2 * grads[i] * grads[i];
        params[i] -= lr * (m[i] / bc1) / (sqrtf(v[i] / bc2) + EMG_ADAM_EPS);
    }
}

#endif /* EMG_ARM_ADAM_H */
