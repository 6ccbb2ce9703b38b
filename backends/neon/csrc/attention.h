/* Causal multi-head self-attention over the T live rows of one sequence, forward and backward.
 *
 * qkv rows hold q | k | v (3d floats); head h uses columns h*hd .. h*hd + hd - 1 of each part (hd = head_dim,
 * a multiple of 4). probs and dscores rows hold cp >= ROUND4(T) floats: row t's weights over s <= t, then 0s
 * up to the next multiple of 4, so every loop over s runs on whole vectors. Rows of K and V past t, read by
 * such a vector, are replaced by row t (their weight is 0, and row t is known to be finite). */
#ifndef EMG_ATTENTION_H
#define EMG_ATTENTION_H

#include <math.h>

#include "neon_math.h"

/* Row s of a matrix with `row` floats per row, or row t when s > t (see above). */
EMG_INLINE const float *row_upto(const float *m, int s, int t, int row) { return m + (long)(s <= t ? s : t) * row; }

/* [a . m_s0, a . m_s0+1, a . m_s0+2, a . m_s0+3] over n floats, rows past t replaced by row t. */
EMG_INLINE float32x4_t dot4_rows(const float *a, const float *m, int s0, int t, int row, int n) {
    const float *m0 = row_upto(m, s0, t, row), *m1 = row_upto(m, s0 + 1, t, row);
    const float *m2 = row_upto(m, s0 + 2, t, row), *m3 = row_upto(m, s0 + 3, t, row);
    float32x4_t c0 = vdupq_n_f32(0.0f), c1 = c0, c2 = c0, c3 = c0;
    for (int i = 0; i < n; i += 4) {
        const float32x4_t av = vld1q_f32(a + i);
        c0 = vfmaq_f32(c0, vld1q_f32(m0 + i), av);
        c1 = vfmaq_f32(c1, vld1q_f32(m1 + i), av);
        c2 = vfmaq_f32(c2, vld1q_f32(m2 + i), av);
        c3 = vfmaq_f32(c3, vld1q_f32(m3 + i), av);
    }
    return sum4_f32x4(c0, c1, c2, c3);
}

/* out[0..n) = sum_{s <= t} w[s] m_s: a weighted sum of rows, each 4-float column block in a register. */
EMG_INLINE void weighted_rows(float *out, const float *w, const float *m, int t, int row, int n) {
    for (int c = 0; c < n; c += 4) {
        float32x4_t acc = vdupq_n_f32(0.0f);
        for (int s0 = 0; s0 <= t; s0 += 4) {
            const float32x4_t w4 = vld1q_f32(w + s0);
            acc = vfmaq_laneq_f32(acc, vld1q_f32(row_upto(m, s0, t, row) + c), w4, 0);
            acc = vfmaq_laneq_f32(acc, vld1q_f32(row_upto(m, s0 + 1, t, row) + c), w4, 1);
            acc = vfmaq_laneq_f32(acc, vld1q_f32(row_upto(m, s0 + 2, t, row) + c), w4, 2);
            acc = vfmaq_laneq_f32(acc, vld1q_f32(row_upto(m, s0 + 3, t, row) + c), w4, 3);
        }
        vst1q_f32(out + c, acc);
    }
}

/* att [T][d] = per head softmax(q k^T / sqrt(hd), causal) v; probs [n_heads][.][cp] (head stride
 * head_stride) keeps the weights for the backward pass. */
EMG_INLINE void attention_forward(float *restrict att, float *restrict probs, const float *restrict qkv, int T,
                                  int d, int n_heads, int hd, int cp, long head_stride) {
    const int row = 3 * d;
    const float32x4_t scale = vdupq_n_f32(1.0f / sqrtf((float)hd));
    for (int h = 0; h < n_heads; h++) {
        const float *q = qkv + h * hd, *k = qkv + d + h * hd, *v = qkv + 2 * d + h * hd;
        for (int t = 0; t < T; t++) {
            float *pr = probs + h * head_stride + (long)t * cp;
            for (int s0 = 0; s0 <= t; s0 += 4)
                vst1q_f32(pr + s0, vmulq_f32(dot4_rows(q + (long)t * row, k, s0, t, row, hd), scale));
            softmax_inplace(pr, t + 1, 0);
            weighted_rows(att + (long)t * d + h * hd, pr, v, t, row, hd);
        }
    }
}

/* From datt [T][d] (the gradient at the attention output) to dqkv [T][3d] = dq | dk | dv, every row of it
 * written. dscores [T][cp] is scratch: one head's gradient at the scaled scores. */
EMG_INLINE void attention_backward(float *restrict dqkv, float *restrict dscores, const float *restrict datt,
                                   const float *restrict probs, const float *restrict qkv, int T, int d,
                                   int n_heads, int hd, int cp, long head_stride) {
    const int row = 3 * d;
    const float32x4_t scale = vdupq_n_f32(1.0f / sqrtf((float)hd));
    for (int h = 0; h < n_heads; h++) {
        const float *q = qkv + h * hd, *k = qkv + d + h * hd, *v = qkv + 2 * d + h * hd;
        float *dq = dqkv + h * hd, *dk = dqkv + d + h * hd, *dv = dqkv + 2 * d + h * hd;
        const float *P = probs + h * head_stride, *dO = datt + h * hd;
        /* Per query row t: dP = dO_t V^T, the softmax's backward dS = P (dP - sum(P dP)) / sqrt(hd), and
         * dq_t = dS K. */
        for (int t = 0; t < T; t++) {
            const float *pr = P + (long)t * cp;
            float *ds = dscores + (long)t * cp;
            float32x4_t rowdot = vdupq_n_f32(0.0f);
            for (int s0 = 0; s0 <= t; s0 += 4) {
                const float32x4_t dp = dot4_rows(dO + (long)t * d, v, s0, t, row, hd);
                vst1q_f32(ds + s0, dp);
                rowdot = vfmaq_f32(rowdot, vld1q_f32(pr + s0), dp);
            }
            const float32x4_t total = vdupq_n_f32(vaddvq_f32(rowdot));
            for (int s0 = 0; s0 <= t; s0 += 4) {
                const float32x4_t dp = vld1q_f32(ds + s0);
                vst1q_f32(ds + s0, vmulq_f32(vmulq_f32(vld1q_f32(pr + s0), vsubq_f32(dp, total)), scale));
            }
            weighted_rows(dq + (long)t * row, ds, k, t, row, hd);
        }
        /* Per key row s, over the query rows t >= s that see it: dk_s = dS^T Q, dv_s = P^T dO. */
        for (int s = 0; s < T; s++) {
            for (int c = 0; c < hd; c += 4) {
                float32x4_t ak = vdupq_n_f32(0.0f), av = ak;
                for (int t = s; t < T; t++) {
                    ak = vfmaq_n_f32(ak, vld1q_f32(q + (long)t * row + c), dscores[(long)t * cp + s]);
                    av = vfmaq_n_f32(av, vld1q_f32(dO + (long)t * d + c), P[(long)t * cp + s]);
                }
                vst1q_f32(dk + (long)s * row + c, ak);
                vst1q_f32(dv + (long)s * row + c, av);
            }
        }
    }
}

#endif
