/* The products with a weight matrix W [out][in] (row-major, as the ABI stores it) over a block of rows:
 *   matmul_forward          Y = X W^T            (dot products of rows, 4 rows x 4 outputs per tile)
 *   matmul_backward_input   dX = dY W            (rows of W accumulated, 4 rows x 16 columns per tile)
 *   matmul_backward_weight  dW += dY^T X         (outer products, 4 outputs x 16 inputs per tile)
 * Each tile keeps its 16 accumulators in registers for the whole reduction and stores them once, and each
 * vector it loads feeds 4 FMAs, so W is read directly in both directions: no transposed copies are kept.
 * in, out and the column counts are multiples of 4 (of 16 for n in matmul_backward_input) and become
 * constants after inlining into a width-specialised kernel; only the vocabulary's out may be any size. */
#ifndef EMG_MATMUL_H
#define EMG_MATMUL_H

#include "neon_math.h"

/* What happens to a result before it is stored (fusing saves a pass over the output). */
enum {
    EP_STORE,     /* y = acc */
    EP_RELU,      /* y = max(acc, 0): the MLP's expansion */
    EP_RESIDUAL,  /* y = aux + acc: a residual connection */
    EP_RELU_MASK, /* y = aux > 0 ? acc : 0: the ReLU's backward, aux its output */
    EP_SCALE,     /* y = acc * aux[0]: attention's scaled scores */
};

EMG_INLINE float32x4_t epilogue(float32x4_t acc, int ep, const float *aux) {
    switch (ep) {
    case EP_RELU: return vmaxq_f32(acc, vdupq_n_f32(0.0f));
    case EP_RESIDUAL: return vaddq_f32(vld1q_f32(aux), acc);
    case EP_RELU_MASK:
        return vreinterpretq_f32_u32(vandq_u32(vcgtq_f32(vld1q_f32(aux), vdupq_n_f32(0.0f)),
                                               vreinterpretq_u32_f32(acc)));
    case EP_SCALE: return vmulq_n_f32(acc, aux[0]);
    default: return acc;
    }
}

/* ---- Y = X W^T ---- */

/* y[p][j..j+3] for p < np (1..4) rows of x: the dot products of np rows with 4 rows of W. */
EMG_INLINE void matmul_forward_tile(float *y, int ys, const float *const w4[4], const float *x, int xs, int np,
                                    int in, int ep, const float *aux, int as) {
    float32x4_t acc[4][4];
    for (int p = 0; p < 4; p++)
        for (int r = 0; r < 4; r++) acc[p][r] = vdupq_n_f32(0.0f);
    for (int i = 0; i < in; i += 4) {
        const float32x4_t b0 = vld1q_f32(w4[0] + i), b1 = vld1q_f32(w4[1] + i);
        const float32x4_t b2 = vld1q_f32(w4[2] + i), b3 = vld1q_f32(w4[3] + i);
        for (int p = 0; p < np; p++) {
            const float32x4_t a = vld1q_f32(x + p * xs + i);
            acc[p][0] = vfmaq_f32(acc[p][0], b0, a);
            acc[p][1] = vfmaq_f32(acc[p][1], b1, a);
            acc[p][2] = vfmaq_f32(acc[p][2], b2, a);
            acc[p][3] = vfmaq_f32(acc[p][3], b3, a);
        }
    }
    for (int p = 0; p < np; p++) {
        const float32x4_t sum = sum4_f32x4(acc[p][0], acc[p][1], acc[p][2], acc[p][3]);
        vst1q_f32(y + p * ys, epilogue(sum, ep, aux ? aux + p * as : 0));
    }
}

/* y[t][j] = ep(sum_i w[j][i] x[t][i]) for t < rows, j < out; x [rows][in] (stride xs), y and aux rows
 * (strides ys, as) hold ROUND4(out) columns: past out they receive copies of the last output, never read. */
EMG_INLINE void matmul_forward(float *y, int ys, const float *w, const float *x, int xs, int rows, int out,
                               int in, int ep, const float *aux, int as) {
    for (int j = 0; j < out; j += 4) {
        const float *w4[4];
        for (int r = 0; r < 4; r++) w4[r] = w + (long)(j + r < out ? j + r : out - 1) * in;
        const float *ax = aux ? aux + j : 0;
        int t = 0;
        for (; t + 4 <= rows; t += 4)
            matmul_forward_tile(y + t * ys + j, ys, w4, x + t * xs, xs, 4, in, ep, ax ? ax + t * as : 0, as);
        switch (rows - t) { /* a constant count of rows per copy keeps every accumulator in a register */
        case 3: matmul_forward_tile(y + t * ys + j, ys, w4, x + t * xs, xs, 3, in, ep, ax ? ax + t * as : 0, as); break;
        case 2: matmul_forward_tile(y + t * ys + j, ys, w4, x + t * xs, xs, 2, in, ep, ax ? ax + t * as : 0, as); break;
        case 1: matmul_forward_tile(y + t * ys + j, ys, w4, x + t * xs, xs, 1, in, ep, ax ? ax + t * as : 0, as); break;
        default: break;
        }
    }
}

/* ---- dX = dY W ---- */

/* acc[p][v] += a[p][lane] * b[v] for one row of W (b, 16 columns) and its coefficient in each of np rows. */
#define ACCUMULATE_ROW(lane)                                                                   \
    do {                                                                                       \
        const int kr = clamp && k + (lane) >= k_rows ? k_rows - 1 : k + (lane);               \
        const float *wr = w + (long)kr * n + c;                                                \
        const float32x4_t b0 = vld1q_f32(wr), b1 = vld1q_f32(wr + 4);                          \
        const float32x4_t b2 = vld1q_f32(wr + 8), b3 = vld1q_f32(wr + 12);                     \
        for (int p = 0; p < np; p++) {                                                         \
            acc[p][0] = vfmaq_laneq_f32(acc[p][0], b0, a[p], lane);                            \
            acc[p][1] = vfmaq_laneq_f32(acc[p][1], b1, a[p], lane);                            \
            acc[p][2] = vfmaq_laneq_f32(acc[p][2], b2, a[p], lane);                            \
            acc[p][3] = vfmaq_laneq_f32(acc[p][3], b3, a[p], lane);                            \
        }                                                                                      \
    } while (0)

/* dx[p][c..c+15] for p < np (1..4) rows of dy. */
EMG_INLINE void matmul_backward_input_tile(float *dx, int dxs, const float *dy, int dys, const float *w, int np,
                                           int k_dim, int k_rows, int n, int c, int ep, const float *aux,
                                           int as) {
    const int clamp = k_rows != k_dim; /* constant 0 for every W but the LM head's */
    float32x4_t acc[4][4];
    for (int p = 0; p < 4; p++)
        for (int v = 0; v < 4; v++) acc[p][v] = vdupq_n_f32(0.0f);
    for (int k = 0; k < k_dim; k += 4) {
        float32x4_t a[4];
        for (int p = 0; p < np; p++) a[p] = vld1q_f32(dy + p * dys + k);
        for (int p = np; p < 4; p++) a[p] = vdupq_n_f32(0.0f);
        ACCUMULATE_ROW(0);
        ACCUMULATE_ROW(1);
        ACCUMULATE_ROW(2);
        ACCUMULATE_ROW(3);
    }
    for (int p = 0; p < np; p++)
        for (int v = 0; v < 4; v++)
            vst1q_f32(dx + p * dxs + c + 4 * v, epilogue(acc[p][v], ep, aux ? aux + p * as + c + 4 * v : 0));
}
#undef ACCUMULATE_ROW

/* dx[t][c] = ep(sum_k dy[t][k] w[k][c]) for t < rows, c < n; w [k_rows][n]. dy rows (stride dys) hold
 * k_dim = ROUND4(k_rows) entries, those past k_rows 0 (W's last row stands in for the missing ones). */
EMG_INLINE void matmul_backward_input(float *dx, int dxs, const float *dy, int dys, const float *w, int rows,
                                      int k_dim, int k_rows, int n, int ep, const float *aux, int as) {
    for (int c = 0; c < n; c += 16) {
        int t = 0;
        for (; t + 4 <= rows; t += 4)
            matmul_backward_input_tile(dx + t * dxs, dxs, dy + t * dys, dys, w, 4, k_dim, k_rows, n, c, ep,
                                       aux ? aux + t * as : 0, as);
        switch (rows - t) {
        case 3: matmul_backward_input_tile(dx + t * dxs, dxs, dy + t * dys, dys, w, 3, k_dim, k_rows, n, c, ep, aux ? aux + t * as : 0, as); break;
        case 2: matmul_backward_input_tile(dx + t * dxs, dxs, dy + t * dys, dys, w, 2, k_dim, k_rows, n, c, ep, aux ? aux + t * as : 0, as); break;
        case 1: matmul_backward_input_tile(dx + t * dxs, dxs, dy + t * dys, dys, w, 1, k_dim, k_rows, n, c, ep, aux ? aux + t * as : 0, as); break;
        default: break;
        }
    }
}

/* ---- dW += dY^T X ---- */

/* dw[j][i] += sum_t dy[t][j] x[t][i] for j < out, i < in (a multiple of 16), t < rows. dy rows (stride dys)
 * hold ROUND4(out) entries. Each tile (4 outputs x 16 inputs) is loaded once, accumulates every row with
 * one load of dy and four of x feeding 16 FMAs, and is stored once. */
EMG_INLINE void matmul_backward_weight(float *dw, const float *dy, int dys, const float *x, int xs, int rows,
                                       int out, int in) {
    for (int j = 0; j < out; j += 4) {
        const int nj = out - j < 4 ? out - j : 4; /* rows of dW this tile owns: 4 except at the vocabulary's end */
        float *d[4];
        for (int r = 0; r < 4; r++) d[r] = dw + (long)(j + (r < nj ? r : nj - 1)) * in;
        for (int i = 0; i < in; i += 16) {
            float32x4_t acc[4][4];
            for (int r = 0; r < 4; r++)
                for (int v = 0; v < 4; v++) acc[r][v] = vld1q_f32(d[r] + i + 4 * v);
            for (int t = 0; t < rows; t++) {
                const float32x4_t g = vld1q_f32(dy + t * dys + j);
                const float *xr = x + t * xs + i;
                for (int v = 0; v < 4; v++) {
                    const float32x4_t xv = vld1q_f32(xr + 4 * v);
                    acc[0][v] = vfmaq_laneq_f32(acc[0][v], xv, g, 0);
                    acc[1][v] = vfmaq_laneq_f32(acc[1][v], xv, g, 1);
                    acc[2][v] = vfmaq_laneq_f32(acc[2][v], xv, g, 2);
                    acc[3][v] = vfmaq_laneq_f32(acc[3][v], xv, g, 3);
                }
            }
            for (int r = 0; r < nj; r++)
                for (int v = 0; v < 4; v++) vst1q_f32(d[r] + i + 4 * v, acc[r][v]);
        }
    }
}

#endif
