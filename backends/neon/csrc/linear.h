/* Matrix-vector products and weight-gradient outer products over row-major W[out][in].
 * All dimensions are multiples of 4 and become constants after inlining into a specialised kernel. */
#ifndef EMG_LINEAR_H
#define EMG_LINEAR_H

#include "neon_math.h"

/* What happens to a dot product before it is stored (fusing saves a pass over the output). */
enum { EP_STORE = 0, EP_RELU = 1, EP_RESIDUAL = 2, EP_MASK = 3 };

EMG_INLINE float epilogue(float acc, int ep, const float *aux, int j) {
    switch (ep) {
    case EP_RELU: return acc > 0.0f ? acc : 0.0f;
    case EP_RESIDUAL: return aux[j] + acc;        /* y = x + W h */
    case EP_MASK: return aux[j] > 0.0f ? acc : 0.0f; /* ReLU backward: aux is the ReLU output */
    default: return acc;
    }
}

/* y0 = ep(W x0) and, when x1 is not NULL, y1 = ep(W x1): each weight vector loaded once feeds both
 * positions (the seed's 2-position batching, optimisation 6). aux0/aux1 are the residual or mask rows. */
EMG_INLINE void matvec2(float *restrict y0, float *restrict y1, const float *restrict w,
                        const float *restrict x0, const float *restrict x1, int out, int in, int ep,
                        const float *aux0, const float *aux1) {
    for (int j = 0; j < out; j++) {
        const float *row = w + (long)j * in;
        float32x4_t wv = vld1q_f32(row);
        float32x4_t a0 = vmulq_f32(wv, vld1q_f32(x0));
        float32x4_t a1 = x1 ? vmulq_f32(wv, vld1q_f32(x1)) : a0;
        for (int i = 4; i < in; i += 4) {
            wv = vld1q_f32(row + i);
            a0 = vfmaq_f32(a0, wv, vld1q_f32(x0 + i));
            if (x1) a1 = vfmaq_f32(a1, wv, vld1q_f32(x1 + i));
        }
        y0[j] = epilogue(vaddvq_f32(a0), ep, aux0, j);
        if (x1) y1[j] = epilogue(vaddvq_f32(a1), ep, aux1, j);
    }
}

/* Y[t] = ep(W X[t]) for t < n_pos, two positions at a time; rows of X, Y and aux are strided. */
EMG_INLINE void matvec_rows(float *y, int ys, const float *w, const float *x, int xs, int n_pos, int out,
                            int in, int ep, const float *aux, int as) {
    int t = 0;
    for (; t + 1 < n_pos; t += 2)
        matvec2(y + t * ys, y + (t + 1) * ys, w, x + t * xs, x + (t + 1) * xs, out, in, ep,
                aux ? aux + t * as : 0, aux ? aux + (t + 1) * as : 0);
    if (t < n_pos) matvec2(y + t * ys, 0, w, x + t * xs, 0, out, in, ep, aux ? aux + t * as : 0, 0);
}

/* Column block of the register accumulators: 8 vectors, leaving room for operands in the 32 registers. */
#define OUTER_BLOCK 32

/* dW[r][:] += sum_t dy[t][r] * x[t][:] over n_pos positions. Each row's block of dW is loaded into
 * registers once, accumulates every position with pure FMAs and is stored once (optimisation 4).
 * Positions whose upstream gradient is exactly 0 (ReLU-masked, sparse logits) are skipped. */
EMG_INLINE void outer_acc(float *restrict dw, const float *restrict dy, int dys, const float *restrict x,
                          int xs, int n_pos, int rows, int cols) {
    const int cb = cols < OUTER_BLOCK ? cols : OUTER_BLOCK;
    for (int r = 0; r < rows; r++) {
        float *drow = dw + (long)r * cols;
        for (int c0 = 0; c0 < cols; c0 += cb) {
            float32x4_t acc[OUTER_BLOCK / 4];
            for (int k = 0; k < cb / 4; k++) acc[k] = vld1q_f32(drow + c0 + 4 * k);
            for (int t = 0; t < n_pos; t++) {
                float g = dy[t * dys + r];
                if (g == 0.0f) continue;
                float32x4_t gv = vdupq_n_f32(g);
                const float *xr = x + t * xs + c0;
                for (int k = 0; k < cb / 4; k++) acc[k] = vfmaq_f32(acc[k], gv, vld1q_f32(xr + 4 * k));
            }
            for (int k = 0; k < cb / 4; k++) vst1q_f32(drow + c0 + 4 * k, acc[k]);
        }
    }
}

/* dst[c][r] = src[r][c]: the transposed weight copies used by the backward matvecs (optimisation 5). */
static inline void transpose_f32(float *restrict dst, const float *restrict src, int rows, int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(long)c * rows + r] = src[(long)r * cols + c];
}

#endif
