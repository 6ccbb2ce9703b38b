/* Causal multi-head self-attention over the live positions of one sequence.
 * qkv rows hold [q | k | v] (3*d floats); head h uses columns h*hd .. h*hd + hd of each part. */
#ifndef EMG_ATTENTION_H
#define EMG_ATTENTION_H

#include <math.h>
#include <string.h>

#include "eemicrogpt.h"
#include "neon_math.h"

/* att[t] = sum_{s<=t} P[t][s] v[s] with P = softmax(q k^T / sqrt(hd)); P is kept as probs[h][t][16]. */
EMG_INLINE void attention_forward(float *restrict att, float *restrict probs, const float *restrict qkv,
                                  int T, int d, int n_heads, int hd) {
    const int row = 3 * d;
    const float scale = 1.0f / sqrtf((float)hd);
    memset(att, 0, sizeof(float) * (size_t)(T * d));
    for (int h = 0; h < n_heads; h++) {
        const float *q = qkv + h * hd, *k = qkv + d + h * hd, *v = qkv + 2 * d + h * hd;
        for (int t = 0; t < T; t++) {
            float *pr = probs + ((long)h * (EMG_MAX_SEQ - 1) + t) * 16;
            for (int s = 0; s <= t; s++) pr[s] = dot_f32(q + t * row, k + s * row, hd) * scale;
            softmax_inplace(pr, t + 1, 0);
            float *out = att + t * d + h * hd;
            for (int s = 0; s <= t; s++) axpy_f32(out, pr[s], v + s * row, hd);
        }
    }
}

/* From datt (gradient at the attention output) to dqkv = [dq | dk | dv], overwriting dqkv. */
EMG_INLINE void attention_backward(float *restrict dqkv, const float *restrict datt,
                                   const float *restrict probs, const float *restrict qkv, int T, int d,
                                   int n_heads, int hd) {
    const int row = 3 * d;
    const float scale = 1.0f / sqrtf((float)hd);
    memset(dqkv, 0, sizeof(float) * (size_t)(T * row));
    for (int h = 0; h < n_heads; h++) {
        const float *q = qkv + h * hd, *k = qkv + d + h * hd, *v = qkv + 2 * d + h * hd;
        float *dq = dqkv + h * hd, *dk = dqkv + d + h * hd, *dv = dqkv + 2 * d + h * hd;
        for (int t = 0; t < T; t++) {
            const float *pr = probs + ((long)h * (EMG_MAX_SEQ - 1) + t) * 16;
            const float *dt = datt + t * d + h * hd;
            float dp[16], rowdot = 0.0f;
            for (int s = 0; s <= t; s++) {
                dp[s] = dot_f32(dt, v + s * row, hd);
                rowdot += pr[s] * dp[s];
            }
            /* softmax Jacobian: dscore = P * (dP - sum(P * dP)), then the 1/sqrt(hd) scale */
            for (int s = 0; s <= t; s++) {
                float ds = pr[s] * (dp[s] - rowdot) * scale;
                axpy_f32(dq + t * row, ds, k + s * row, hd);
                axpy_f32(dk + s * row, ds, q + t * row, hd);
                axpy_f32(dv + s * row, pr[s], dt, hd);
            }
        }
    }
}

#endif
