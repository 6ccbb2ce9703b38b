/* Causal multi-head self-attention over the T live rows of one sequence, forward and backward, as blocked
 * GEMMs: query rows go in blocks of 4, key rows in blocks of 4, and only the blocks on or below the diagonal
 * are computed (a query block t0..t0+3 sees key blocks s0 <= t0), so the upper triangle costs nothing beyond
 * the diagonal blocks' padding. Each 4 x 4 tile keeps its accumulators in registers and every vector it loads
 * feeds 4 FMAs; the score tiles are matmul.h's forward tile (query rows against key rows).
 *
 * qkv rows hold q | k | v (3d floats); head h uses columns h*hd .. h*hd + hd - 1 of each part (hd = head_dim,
 * a multiple of 4). probs and dscores rows hold cp >= ROUND4(T) floats: row t's weights over s <= t, then 0s
 * up to the next multiple of 4, so every loop over s runs on whole vectors. Rows of K and V past the sequence,
 * read by a tile on the diagonal, are replaced by its last row (their weight is 0, and that row is finite).
 * Every sum runs in the same order as a row-at-a-time loop would (over the head's columns in 4 lanes, then
 * over s or t ascending), so blocking changes no bit. */
#ifndef EMG_ATTENTION_H
#define EMG_ATTENTION_H

#include <math.h>

#include "matmul.h"
#include "neon_math.h"

/* m4[r] = row s0 + r of a matrix with `row` floats per row, or row `last` past it. */
EMG_INLINE void rows_upto(const float *m4[4], const float *m, int s0, int last, int row) {
    for (int r = 0; r < 4; r++) m4[r] = m + (long)(s0 + r <= last ? s0 + r : last) * row;
}

/* out_p[0..n) = sum_{s < s_end} w_p[s] m_s for np (1..4) rows w_p = w + p * ws (s_end a multiple of 4, rows of
 * m past `last` replaced by row last: their weights are 0); out rows are os floats apart. */
EMG_INLINE void weighted_tile(float *out, int os, const float *w, int ws, const float *m, int s_end, int last,
                              int row, int n, const int np) {
    for (int c = 0; c < n; c += 4) {
        float32x4_t acc[4];
        for (int p = 0; p < 4; p++) acc[p] = vdupq_n_f32(0.0f);
        for (int s0 = 0; s0 < s_end; s0 += 4) {
            const float *m4[4];
            rows_upto(m4, m, s0, last, row);
            const float32x4_t v0 = vld1q_f32(m4[0] + c), v1 = vld1q_f32(m4[1] + c);
            const float32x4_t v2 = vld1q_f32(m4[2] + c), v3 = vld1q_f32(m4[3] + c);
            for (int p = 0; p < np; p++) {
                const float32x4_t w4 = vld1q_f32(w + (long)p * ws + s0);
                acc[p] = vfmaq_laneq_f32(acc[p], v0, w4, 0);
                acc[p] = vfmaq_laneq_f32(acc[p], v1, w4, 1);
                acc[p] = vfmaq_laneq_f32(acc[p], v2, w4, 2);
                acc[p] = vfmaq_laneq_f32(acc[p], v3, w4, 3);
            }
        }
        for (int p = 0; p < np; p++) vst1q_f32(out + (long)p * os + c, acc[p]);
    }
}

/* Forward of query rows t0..t0+np-1 of one head: their scores over key blocks s0 <= t0, softmax, and
 * att_t = sum_s P[t][s] v_s. pr is probs row t0 of the head, att row t0 at the head's columns. */
EMG_INLINE void forward_block(float *att, float *pr, const float *q, const float *k, const float *v, int t0,
                              int T, int d, int row, int hd, int cp, const float *scale, const int np) {
    for (int s0 = 0; s0 <= t0; s0 += 4) {
        const float *k4[4];
        rows_upto(k4, k, s0, T - 1, row);
        matmul_forward_tile(pr + s0, cp, k4, q + (long)t0 * row, row, np, hd, EP_SCALE, scale, 0);
    }
    for (int p = 0; p < np; p++) softmax_inplace(pr + (long)p * cp, t0 + p + 1, 0);
    weighted_tile(att, d, pr, cp, v, t0 + 4, T - 1, row, hd, np);
}

/* att [T][d] = per head softmax(q k^T / sqrt(hd), causal) v; probs [n_heads][.][cp] (head stride
 * head_stride) keeps the weights for the backward pass. */
EMG_INLINE void attention_forward(float *restrict att, float *restrict probs, const float *restrict qkv, int T,
                                  int d, int n_heads, int hd, int cp, long head_stride) {
    const int row = 3 * d;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int h = 0; h < n_heads; h++) {
        const float *q = qkv + h * hd, *k = qkv + d + h * hd, *v = qkv + 2 * d + h * hd;
        for (int t0 = 0; t0 < T; t0 += 4) {
            float *o = att + (long)t0 * d + h * hd, *pr = probs + h * head_stride + (long)t0 * cp;
            switch (T - t0 < 4 ? T - t0 : 4) { /* a constant row count per copy keeps the tiles in registers */
            case 4: forward_block(o, pr, q, k, v, t0, T, d, row, hd, cp, &scale, 4); break;
            case 3: forward_block(o, pr, q, k, v, t0, T, d, row, hd, cp, &scale, 3); break;
            case 2: forward_block(o, pr, q, k, v, t0, T, d, row, hd, cp, &scale, 2); break;
            default: forward_block(o, pr, q, k, v, t0, T, d, row, hd, cp, &scale, 1); break;
            }
        }
    }
}

/* Backward of query rows t0..t0+np-1 of one head: dP = dO V^T over key blocks s0 <= t0, the softmax's
 * backward dS = P (dP - sum(P dP)) / sqrt(hd) into ds (dscores row t0), and dq_t = dS K. pr is probs row t0
 * of the head, dO datt row t0 and dq dqkv row t0 at the head's columns. */
EMG_INLINE void backward_block(float *dq, float *ds, const float *dO, const float *pr, const float *k,
                               const float *v, int t0, int T, int d, int row, int hd, int cp, float32x4_t scale,
                               const int np) {
    for (int s0 = 0; s0 <= t0; s0 += 4) {
        const float *v4[4];
        rows_upto(v4, v, s0, T - 1, row);
        matmul_forward_tile(ds + s0, cp, v4, dO, d, np, hd, EP_STORE, 0, 0);
    }
    for (int p = 0; p < np; p++) {
        const float *prp = pr + (long)p * cp;
        float *dsp = ds + (long)p * cp;
        float32x4_t rowdot = vdupq_n_f32(0.0f);
        for (int s0 = 0; s0 <= t0; s0 += 4) rowdot = vfmaq_f32(rowdot, vld1q_f32(prp + s0), vld1q_f32(dsp + s0));
        const float32x4_t total = vdupq_n_f32(vaddvq_f32(rowdot));
        for (int s0 = 0; s0 <= t0; s0 += 4) {
            const float32x4_t dp = vld1q_f32(dsp + s0);
            vst1q_f32(dsp + s0, vmulq_f32(vmulq_f32(vld1q_f32(prp + s0), vsubq_f32(dp, total)), scale));
        }
    }
    weighted_tile(dq, row, ds, cp, k, t0 + 4, T - 1, row, hd, np);
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
        for (int t0 = 0; t0 < T; t0 += 4) {
            float *dqt = dq + (long)t0 * row, *ds = dscores + (long)t0 * cp;
            const float *pr = P + (long)t0 * cp, *dOt = dO + (long)t0 * d;
            switch (T - t0 < 4 ? T - t0 : 4) {
            case 4: backward_block(dqt, ds, dOt, pr, k, v, t0, T, d, row, hd, cp, scale, 4); break;
            case 3: backward_block(dqt, ds, dOt, pr, k, v, t0, T, d, row, hd, cp, scale, 3); break;
            case 2: backward_block(dqt, ds, dOt, pr, k, v, t0, T, d, row, hd, cp, scale, 2); break;
            default: backward_block(dqt, ds, dOt, pr, k, v, t0, T, d, row, hd, cp, scale, 1); break;
            }
        }
        /* Per key block s0..s0+3, over the query rows t >= s0 that see it (dS and P are 0 where t < s):
         * dk_s = dS^T Q, dv_s = P^T dO. */
        for (int s0 = 0; s0 < T; s0 += 4) {
            const int nk = T - s0 < 4 ? T - s0 : 4;
            for (int c = 0; c < hd; c += 4) {
                float32x4_t ak[4], av[4];
                for (int r = 0; r < 4; r++) ak[r] = av[r] = vdupq_n_f32(0.0f);
                for (int t = s0; t < T; t++) {
                    const float32x4_t qv = vld1q_f32(q + (long)t * row + c), ov = vld1q_f32(dO + (long)t * d + c);
                    const float32x4_t dsv = vld1q_f32(dscores + (long)t * cp + s0);
                    const float32x4_t pv = vld1q_f32(P + (long)t * cp + s0);
                    ak[0] = vfmaq_laneq_f32(ak[0], qv, dsv, 0);
                    ak[1] = vfmaq_laneq_f32(ak[1], qv, dsv, 1);
                    ak[2] = vfmaq_laneq_f32(ak[2], qv, dsv, 2);
                    ak[3] = vfmaq_laneq_f32(ak[3], qv, dsv, 3);
                    av[0] = vfmaq_laneq_f32(av[0], ov, pv, 0);
                    av[1] = vfmaq_laneq_f32(av[1], ov, pv, 1);
                    av[2] = vfmaq_laneq_f32(av[2], ov, pv, 2);
                    av[3] = vfmaq_laneq_f32(av[3], ov, pv, 3);
                }
                for (int r = 0; r < 4; r++) {
                    if (r == nk) break;
                    vst1q_f32(dk + (long)(s0 + r) * row + c, ak[r]);
                    vst1q_f32(dv + (long)(s0 + r) * row + c, av[r]);
                }
            }
        }
    }
}

#endif
