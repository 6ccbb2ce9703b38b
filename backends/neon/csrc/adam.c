/* Bias-corrected Adam over the flat parameter buffer, with the ABI header's constants. */
#include <arm_neon.h>
#include <math.h>

#include "session.h"

void adam_update(float *params, const float *grads, float *m, float *v, long n, int64_t step, float lr) {
    /* Bias corrections in double, as the core's optim.py computes them, then rounded once. */
    const float bc1 = (float)(1.0 - pow((double)EMG_ADAM_BETA1, (double)step));
    const float bc2 = (float)(1.0 - pow((double)EMG_ADAM_BETA2, (double)step));
    const float32x4_t b1 = vdupq_n_f32(EMG_ADAM_BETA1), c1 = vdupq_n_f32(1.0f - EMG_ADAM_BETA1);
    const float32x4_t b2 = vdupq_n_f32(EMG_ADAM_BETA2), c2 = vdupq_n_f32(1.0f - EMG_ADAM_BETA2);
    const float32x4_t vbc1 = vdupq_n_f32(bc1), vbc2 = vdupq_n_f32(bc2);
    const float32x4_t eps = vdupq_n_f32(EMG_ADAM_EPS), vlr = vdupq_n_f32(lr);
    long i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t g = vld1q_f32(grads + i);
        float32x4_t mi = vfmaq_f32(vmulq_f32(b1, vld1q_f32(m + i)), c1, g);
        float32x4_t vi = vfmaq_f32(vmulq_f32(b2, vld1q_f32(v + i)), c2, vmulq_f32(g, g));
        vst1q_f32(m + i, mi);
        vst1q_f32(v + i, vi);
        float32x4_t den = vaddq_f32(vsqrtq_f32(vdivq_f32(vi, vbc2)), eps);
        float32x4_t upd = vdivq_f32(vmulq_f32(vlr, vdivq_f32(mi, vbc1)), den);
        vst1q_f32(params + i, vsubq_f32(vld1q_f32(params + i), upd));
    }
    for (; i < n; i++) { /* any n; idle while n_params is a multiple of d_model, so of 16 */
        m[i] = EMG_ADAM_BETA1 * m[i] + (1.0f - EMG_ADAM_BETA1) * grads[i];
        v[i] = EMG_ADAM_BETA2 * v[i] + (1.0f - EMG_ADAM_BETA2) * grads[i] * grads[i];
        params[i] -= lr * (m[i] / bc1) / (sqrtf(v[i] / bc2) + EMG_ADAM_EPS);
    }
}
