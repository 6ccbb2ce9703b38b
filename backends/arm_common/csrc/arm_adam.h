/* Bias-corrected AdamW over the flat parameter buffer with a session's emg_optimizer, four lanes at a time,
 * shared by the ARM backends: the same operations as eemicrogpt's optim.py in float32 (FMA for the moment
 * updates, IEEE sqrt and divide; the bias corrections and the decay factor in double, rounded once), about
 * 5 instructions per parameter instead of the ~32 of a scalar loop that libm's sqrtf keeps from vectorising.
 * The layer has already clipped the gradient (emg_clip_gradients). */
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

/* The pass itself. `decays` is a constant of each call site, so the loop without decay has no multiply
 * more than Adam's (the default optimiser's step runs the loop it ran before AdamW). */
EMG_INLINE void adam_pass(float *restrict params, const float *restrict grads, float *restrict m, float *restrict v,
                          long n, const emg_optimizer *opt, int64_t step, float lr, const int g2, const int decays) {
    const float beta1 = opt->beta1, beta2 = opt->beta2, eps = opt->eps;
    const float bc1 = (float)(1.0 - pow((double)beta1, (double)step));
    const float bc2 = (float)(1.0 - pow((double)beta2, (double)step));
    /* 1 - beta in float: exact (Sterbenz) for beta in [0.5, 1), which holds the defaults; below 0.5 it is
     * rounded once, as optim.py's float32 cast of the same difference. */
    const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
    /* p *= 1 - lr * wd, the factor rounded once from double (optim.py's order: decay, then the Adam step). */
    const float keep = decays ? (float)(1.0 - (double)lr * (double)opt->weight_decay) : 1.0f;
    const float32x4_t b1 = vdupq_n_f32(beta1), b2 = vdupq_n_f32(beta2), vkeep = vdupq_n_f32(keep);
    const float32x4_t vbc1 = vdupq_n_f32(bc1), vbc2 = vdupq_n_f32(bc2), veps = vdupq_n_f32(eps);
    const long n4 = n & ~3L;
    for (long i = 0; i < n4; i += 4) {
        const float32x4_t g = vld1q_f32(grads + i);
        const float32x4_t mi = vfmaq_n_f32(vmulq_f32(b1, vld1q_f32(m + i)), g, a1);
        const float32x4_t b2v = vmulq_f32(b2, vld1q_f32(v + i));
        const float32x4_t vi = g2 == ADAM_G2_SQUARE_FIRST ? vfmaq_n_f32(b2v, vmulq_f32(g, g), a2)
                                                          : vfmaq_f32(b2v, vmulq_n_f32(g, a2), g);
        vst1q_f32(m + i, mi);
        vst1q_f32(v + i, vi);
        const float32x4_t den = vaddq_f32(vsqrtq_f32(vdivq_f32(vi, vbc2)), veps);
        float32x4_t p = vld1q_f32(params + i);
        if (decays) p = vmulq_f32(p, vkeep); /* rounded before the subtraction: no FMA, as optim.py */
        vst1q_f32(params + i, vsubq_f32(p, vdivq_f32(vmulq_n_f32(vdivq_f32(mi, vbc1), lr), den)));
    }
    for (long i = n4; i < n; i++) { /* idle while n_params is a multiple of d_model, so of 16 */
        m[i] = beta1 * m[i] + a1 * grads[i];
        v[i] = beta2 * v[i] + a2 * grads[i] * grads[i];
        if (decays) params[i] *= keep;
        params[i] -= lr * (m[i] / bc1) / (sqrtf(v[i] / bc2) + eps);
    }
}

/* One update (the layer has counted it: step >= 1) of every parameter with opt's decay, betas and eps; any
 * n. Decay only when weight_decay > 0. */
EMG_INLINE void adam_update(float *restrict params, const float *restrict grads, float *restrict m, float *restrict v,
                            long n, const emg_optimizer *opt, int64_t step, float lr, const int g2) {
    if (opt->weight_decay > 0.0f) adam_pass(params, grads, m, v, n, opt, step, lr, g2, 1);
    else adam_pass(params, grads, m, v, n, opt, step, lr, g2, 0);
}

#endif /* EMG_ARM_ADAM_H */
