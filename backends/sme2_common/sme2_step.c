/*
 * The training step of the SME2 backends (native ABI of eemicrogpt.h). C and Neon intrinsics, never
 * streaming; every matrix product goes to the FMOPA engine in sme2_gemm.c.
 *
 * Layout: live (batch, position) rows are packed densely, row n = one position that predicts a token,
 * so every GEMM runs over N = sum(len - 1) rows with only the last partial tile masked. Activations are
 * kept position-major [N][width]. The GEMM operand that must be k-major (feature-major) comes, where a
 * GEMM produced it, from that GEMM's vertical ZA readout (emg_gemm.Ct), and otherwise from a Neon 4x4
 * transpose into a shared scratch (opT). The backward pass works on the gradient
 * of the summed loss (dlogits = softmax - onehot, O(1) per row): that is loss scaling for the fp16 build,
 * and 1/N is applied once, in the fp32 readout of the weight gradients.
 */
#include <arm_neon.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "emg_backend.h"
#include "sme2_internal.h"

#define V EMG_VOCAB
#define S EMG_MAX_SEQ
#define MAX_ALLOCS 64

/* The attention operands that need an fp16 copy in the fp16 build (see as_op). */
enum att_op { OP_QK, OP_VALS, OP_PT, OP_ATTT, OP_VT, OP_DATTT, OP_DATT, OP_QKPM, OP_DST, OP_DS, OP_P, OP_N };

struct emg_session {
    emg_core core; /* shape, layout, step and the training state: owned by the shared layer */
    /* the kernels' short names for core's fields, set once by init */
    int d, h, hd, f, max_rows;
    long n_params;
    float *p, *m, *v, *g; /* params, Adam moments, gradient: the ABI layout */
    long o_tok, o_pos, o_qkv, o_wo, o_f1, o_f2, o_lm; /* tensor offsets in the layout */
    /* k-major weight operands (W transposed), rebuilt after every parameter change */
    op_t *t_qkv, *t_wo, *t_f1, *t_f2, *t_lm;
    /* row-major weight operands for the backward input gradients (aliases of p in the fp32 build) */
    const op_t *w_qkv, *w_wo, *w_f1, *w_f2, *w_lm;
    /* the packed batch */
    int n_rows;
    int *seq_start, *seq_len;
    uint8_t *row_tok, *row_pos, *row_tgt;
    /* activations, [rows][width] */
    float *x0, *r0, *h1, *r1, *att, *x1, *h2, *r2, *hid, *x2, *logits;
    /* attention: q and k feature-major [2D][N] (the operands of the score GEMMs), vals position-major
     * [N][D] (the operand of the value GEMMs), per (sequence, head) blocks of S x S, and att^T [D][N] */
    float *qk, *vals, *scores, *pt, *attT;
    /* attention backward: V^T and datt^T [D][N], Q|K position-major [N][2D], P and dS per block (t-major) */
    float *vT, *dattT, *qk_pm, *p_blk, *ds_blk;
    emg_gemm *att_gemms; /* descriptors per (sequence, head), each product set in one streaming session */
    /* gradients of the summed loss, [rows][width] */
    float *dlog, *dx2, *dpre, *dh2, *dx1, *datt, *dqkv, *dh1;
    op_t *opT; /* feature-major operand scratch, [max(4D, 3D)][rows] */
    /* fp32 feature-major results that a GEMM's vertical ZA readout wrote beside its position-major one
     * (emg_gemm.Ct): hid^T (also the ReLU-backward gate of dpre^T), and two chained-gradient buffers */
    float *hidT, *tA, *tB;
    const op_t *qk_op, *vals_op, *pt_op, *attT_op; /* GEMM operand views of four of them */
#if EMG_SME_F16
    op_t *h_w;          /* fp16 copies of the row-major weights (the w_* point into it) */
    op_t *h_ops[OP_N]; /* fp16 copies of the attention operands, see enum att_op */
    op_t *h_act; /* fp16 copies of the position-major weight-gradient operands */
#endif
    void *allocs[MAX_ALLOCS];
    int n_allocs, alloc_failed;
};

/* ---- allocation ------------------------------------------------------------------------------ */

static void *session_alloc(emg_session *s, size_t bytes) {
    if (s->n_allocs == MAX_ALLOCS) {
        s->alloc_failed = 1;
        return NULL;
    }
    bytes = (bytes + 63) & ~(size_t)63;
    void *ptr = aligned_alloc(64, bytes ? bytes : 64);
    if (ptr) {
        memset(ptr, 0, bytes);
        s->allocs[s->n_allocs++] = ptr;
    } else {
        s->alloc_failed = 1;
    }
    return ptr;
}

static void session_free(emg_session *s) {
    for (int i = 0; i < s->n_allocs; i++) free(s->allocs[i]);
    s->n_allocs = 0;
}

/* ---- layout helpers -------------------------------------------------------------------------- */

/* Transpose a 4x4 block held in four row registers: two TRN rounds, 32-bit then 64-bit, instead of 16
 * strided scalar moves. */
static inline float32x4x4_t transpose4x4_regs(float32x4_t r0, float32x4_t r1, float32x4_t r2, float32x4_t r3) {
    const float32x4x2_t ab = vtrnq_f32(r0, r1), ce = vtrnq_f32(r2, r3);
    const float64x2_t ab0 = vreinterpretq_f64_f32(ab.val[0]), ab1 = vreinterpretq_f64_f32(ab.val[1]);
    const float64x2_t ce0 = vreinterpretq_f64_f32(ce.val[0]), ce1 = vreinterpretq_f64_f32(ce.val[1]);
    return (float32x4x4_t){{vreinterpretq_f32_f64(vtrn1q_f64(ab0, ce0)), vreinterpretq_f32_f64(vtrn1q_f64(ab1, ce1)),
                            vreinterpretq_f32_f64(vtrn2q_f64(ab0, ce0)), vreinterpretq_f32_f64(vtrn2q_f64(ab1, ce1))}};
}

/* The same for a block in memory, source rows ls apart. */
static inline float32x4x4_t transpose4x4(const float *src, long ls) {
    return transpose4x4_regs(vld1q_f32(src), vld1q_f32(src + ls), vld1q_f32(src + 2 * ls), vld1q_f32(src + 3 * ls));
}

/* dst[c][r] = src[r][c] for a [rows][cols] source, as fp32 (half = 0) or fp16 (half = 1): Neon 4x4
 * blocks (seed #19); the ragged right and bottom edges (a packed row count, V = 27) are scalar. Callers
 * pass a constant `half`, so each use compiles to one specialised loop. */
static inline __attribute__((always_inline)) void transpose_to(void *restrict dst, const float *restrict src,
                                                                int rows, int cols, int half) {
    float *restrict d32 = dst;
    __fp16 *restrict d16 = dst;
    const int r4 = rows & ~3, c4 = cols & ~3;
    for (int r = 0; r < r4; r += 4) {
        for (int c = 0; c < c4; c += 4) {
            const float32x4x4_t t = transpose4x4(src + (long)r * cols + c, cols);
            for (int i = 0; i < 4; i++) {
                const long at = (long)(c + i) * rows + r;
                if (half) vst1_f16((float16_t *)(d16 + at), vcvt_f16_f32(t.val[i]));
                else vst1q_f32(d32 + at, t.val[i]);
            }
        }
        for (int c = c4; c < cols; c++)
            for (int k = r; k < r + 4; k++) {
                const float x = src[(long)k * cols + c];
                if (half) d16[(long)c * rows + k] = (__fp16)x;
                else d32[(long)c * rows + k] = x;
            }
    }
    for (int r = r4; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const float x = src[(long)r * cols + c];
            if (half) d16[(long)c * rows + r] = (__fp16)x;
            else d32[(long)c * rows + r] = x;
        }
}

/* Transpose into a GEMM operand (fp16 in the fp16 build). */
static void transpose_op(op_t *restrict dst, const float *restrict src, int rows, int cols) {
    transpose_to(dst, src, rows, cols, EMG_SME_F16);
}

#if EMG_SME_F16
static void to_f16(op_t *restrict dst, const float *restrict src, long n) {
    for (long i = 0; i < n; i++) dst[i] = (op_t)src[i];
}
#endif

static void refresh_weight_operands(emg_session *s) {
    const int d = s->d, f = s->f;
    transpose_op(s->t_qkv, s->p + s->o_qkv, 3 * d, d);
    transpose_op(s->t_wo, s->p + s->o_wo, d, d);
    transpose_op(s->t_f1, s->p + s->o_f1, f, d);
    transpose_op(s->t_f2, s->p + s->o_f2, d, f);
    transpose_op(s->t_lm, s->p + s->o_lm, V, d);
#if EMG_SME_F16
    /* Wq..Wlm are contiguous in the layout: one conversion covers all five row-major operands. */
    to_f16(s->h_w, s->p + s->o_qkv, s->n_params - s->o_qkv);
#endif
}

static void gemm(int M, int N, int K, const op_t *A, long lda, const op_t *B, long ldb, float *C, long ldc,
                 int flags, const float *gate) {
    const emg_gemm g = {M, N, K, A, lda, B, ldb, C, ldc, 1.0f, flags, gate, NULL, 0, NULL};
    sme_gemm(&g);
}

/* The same, also storing the result transposed into Ct (leading dimension M: feature-major, the k-major
 * operand of the next GEMM), gate_t being the gate in that layout. */
static void gemm_t(int M, int N, int K, const op_t *A, long lda, const op_t *B, long ldb, float *C, long ldc,
                   int flags, const float *gate, float *Ct, const float *gate_t) {
    const emg_gemm g = {M, N, K, A, lda, B, ldb, C, ldc, 1.0f, flags, gate, Ct, M, gate_t};
    sme_gemm(&g);
}

/* ---- elementwise pieces -------------------------------------------------------------------- */

/* Neon glue (seed #21). Widths are multiples of 16 (d_model 64 or 128) unless said otherwise. */

/* sum_i a[i] * b[i]: four independent accumulators (no FMA latency chain), one add tree at the end. */
static inline float dot_d(const float *a, const float *b, int d) {
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
    for (int i = 0; i < d; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    return vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
}

/* e^x for x <= 0 (softmax arguments after the max is subtracted), four lanes: x = n ln2 + r with
 * |r| <= ln2/2, e^r by its degree-7 Taylor polynomial (truncation < 6e-9 relative, so float rounding,
 * a few ulp, dominates), 2^n built in the exponent field. Inputs below -87 give e^-87 instead of
 * something smaller: against a softmax sum >= 1 that is invisible. */
static inline float32x4_t exp4(float32x4_t x) {
    x = vmaxq_f32(x, vdupq_n_f32(-87.0f));
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f)); /* ln2, high bits: n * hi is exact */
    r = vfmsq_f32(r, n, vdupq_n_f32(1.42860682030941723e-6f));       /* ln2, the rest */
    float32x4_t p = vdupq_n_f32(1.0f / 5040.0f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

static void rms_forward(float *restrict y, float *restrict r, const float *restrict x, int rows, int d) {
    for (int n = 0; n < rows; n++) {
        const float *xn = x + (long)n * d;
        const float rn = 1.0f / sqrtf(dot_d(xn, xn, d) / (float)d + EMG_RMS_EPS);
        r[n] = rn;
        for (int i = 0; i < d; i += 4) vst1q_f32(y + (long)n * d + i, vmulq_n_f32(vld1q_f32(xn + i), rn));
    }
}

/* out = base + r * (dy - y * mean(dy * y)); base may be NULL (then 0). out may alias dy. */
static void rms_backward(float *out, const float *base, const float *dy, const float *y, const float *r,
                         int rows, int d) {
    for (int n = 0; n < rows; n++) {
        const long o = (long)n * d;
        const float mean = dot_d(dy + o, y + o, d) / (float)d;
        for (int i = 0; i < d; i += 4) {
            const float32x4_t dv = vld1q_f32(dy + o + i), yv = vld1q_f32(y + o + i);
            float32x4_t v = vmulq_n_f32(vfmsq_n_f32(dv, yv, mean), r[n]);
            if (base) v = vaddq_f32(vld1q_f32(base + o + i), v);
            vst1q_f32(out + o + i, v);
        }
    }
}

/* The GEMM operand view of a float buffer: the buffer itself in fp32, an fp16 copy in fp16. */
static const op_t *as_op(emg_session *s, enum att_op which, const float *src, long n) {
#if EMG_SME_F16
    to_f16(s->h_ops[which], src, n);
    return s->h_ops[which];
#else
    (void)s, (void)which, (void)n;
    return src;
#endif
}

/* A feature-major fp32 result as the next GEMM's k-major operand: itself in fp32, converted into the
 * operand scratch in fp16. */
static const op_t *as_kmajor(emg_session *s, const float *t, long count) {
#if EMG_SME_F16
    to_f16(s->opT, t, count);
    return s->opT;
#else
    (void)s, (void)count;
    return t;
#endif
}

/* P^T = causal softmax of each column t of S^T over u <= t, P^T[u][t] = 0 for u > t (the mask); one
 * S x S block, len live rows and columns. Neon across four columns at a time (rows are contiguous in t),
 * lanes with u > t masked; each column's max and sum run over u in order as in the scalar form. Lanes
 * of columns >= len compute on stale, finite scores and are never read. */
static void softmax_causal_columns(float *restrict pt, const float *restrict st, int len) {
    const float32x4_t ninf = vdupq_n_f32(-INFINITY), zero = vdupq_n_f32(0.0f);
    const uint32x4_t lane = {0, 1, 2, 3};
    for (int t0 = 0; t0 < len; t0 += 4) {
        const uint32x4_t tv = vaddq_u32(lane, vdupq_n_u32((uint32_t)t0));
        const int live = t0 + 4 < len ? t0 + 4 : len; /* rows u < live have a lane with u <= t */
        float32x4_t mx = ninf, sum = zero;
        for (int u = 0; u < live; u++) {
            const uint32x4_t ok = vcleq_u32(vdupq_n_u32((uint32_t)u), tv);
            mx = vmaxq_f32(mx, vbslq_f32(ok, vld1q_f32(st + u * S + t0), ninf));
        }
        for (int u = 0; u < live; u++) {
            const uint32x4_t ok = vcleq_u32(vdupq_n_u32((uint32_t)u), tv);
            const float32x4_t e = vbslq_f32(ok, exp4(vsubq_f32(vld1q_f32(st + u * S + t0), mx)), zero);
            vst1q_f32(pt + u * S + t0, e);
            sum = vaddq_f32(sum, e);
        }
        const float32x4_t inv = vdivq_f32(vdupq_n_f32(1.0f), sum);
        for (int u = 0; u < live; u++) vst1q_f32(pt + u * S + t0, vmulq_f32(vld1q_f32(pt + u * S + t0), inv));
        for (int u = live; u < len; u++) vst1q_f32(pt + u * S + t0, zero);
    }
}

/* The causal softmax backward of one S x S block, in Neon across four columns t at a time, the layout the
 * forward left P^T in (u-major, t contiguous):
 *   c[t] = sum_{u <= t} P^T[u][t] dP^T[u][t]           (over u in order, one lane per t: a fixed order)
 *   dS^T[u][t] = P^T[u][t] (dP^T[u][t] - c[t]) scale    (u <= t; exactly 0 above the diagonal)
 * dS^T overwrites dP^T (the operand of dQ, contracting over u). The operands of dK and dV contract over t,
 * so they are t-major: each 4x4 block of dS^T and of P^T leaves the registers it was computed or loaded in
 * a second time, transposed by TRN (seed #19), as dS[t][u] and P[t][u]. No pass re-reads a block.
 * Rows and columns run to len rounded up to 4 (<= S); P^T is 0 for u > t, so lanes with u > t add exact
 * zeros to c. Lanes of columns or rows >= len compute on stale, finite values and are never read. */
static void softmax_backward_columns(float *restrict dst, float *restrict ds, float *restrict p,
                                     const float *restrict pt, int len, float scale) {
    const float32x4_t zero = vdupq_n_f32(0.0f);
    const uint32x4_t lane = {0, 1, 2, 3};
    const int len4 = (len + 3) & ~3;
    for (int t0 = 0; t0 < len; t0 += 4) {
        const uint32x4_t tv = vaddq_u32(lane, vdupq_n_u32((uint32_t)t0));
        const int live = t0 + 4 < len ? t0 + 4 : len; /* rows u < live have a lane with u <= t */
        float32x4_t c = zero;
        for (int u = 0; u < live; u++) c = vfmaq_f32(c, vld1q_f32(pt + u * S + t0), vld1q_f32(dst + u * S + t0));
        for (int u0 = 0; u0 < len4; u0 += 4) {
            float32x4_t pr[4], dr[4];
            for (int i = 0; i < 4; i++) {
                const int u = u0 + i;
                const uint32x4_t ok = vcleq_u32(vdupq_n_u32((uint32_t)u), tv);
                pr[i] = vld1q_f32(pt + u * S + t0);
                const float32x4_t v = vmulq_n_f32(vmulq_f32(pr[i], vsubq_f32(vld1q_f32(dst + u * S + t0), c)), scale);
                dr[i] = vbslq_f32(ok, v, zero);
                vst1q_f32(dst + u * S + t0, dr[i]);
            }
            const float32x4x4_t dsb = transpose4x4_regs(dr[0], dr[1], dr[2], dr[3]);
            const float32x4x4_t pb = transpose4x4_regs(pr[0], pr[1], pr[2], pr[3]);
            for (int i = 0; i < 4; i++) {
                vst1q_f32(ds + (t0 + i) * S + u0, dsb.val[i]);
                vst1q_f32(p + (t0 + i) * S + u0, pb.val[i]);
            }
        }
    }
}

/* Attention as ZA-tile GEMMs, every (sequence, head) pair in one streaming session per product:
 *   S^T[u][t] = scale * sum_j K[u][j] Q[t][j]      (A = K^T, B = Q^T: both feature-major, from the QKV GEMM)
 *   P^T = causal softmax over u of each column t    (C, outside streaming mode)
 *   att^T[j][t] = sum_u V[u][j] P^T[u][t]           (A = V position-major, B = P^T; written into att^T)
 * Computing S transposed makes P^T, the k-major operand of the value product, come out directly. */
static void attention_forward(emg_session *s, int batch) {
    const int n = s->n_rows, d = s->d, hd = s->hd, heads = s->h;
    const float scale = 1.0f / sqrtf((float)hd);
    const op_t *q_t = s->qk_op, *k_t = s->qk_op + (long)d * n;
    int g = 0;
    for (int b = 0; b < batch; b++)
        for (int hh = 0; hh < heads; hh++, g++) {
            const int r0 = s->seq_start[b], len = s->seq_len[b];
            s->att_gemms[g] = (emg_gemm){len, len, hd, k_t + (long)hh * hd * n + r0, n,
                                         q_t + (long)hh * hd * n + r0, n, s->scores + (long)g * S * S, S,
                                         scale, 0, NULL, NULL, 0, NULL};
        }
    sme_gemm_many(s->att_gemms, g);

    for (int b = 0, g2 = 0; b < batch; b++)
        for (int hh = 0; hh < heads; hh++, g2++) {
            const int len = s->seq_len[b];
            const float *st = s->scores + (long)g2 * S * S;
            float *pt = s->pt + (long)g2 * S * S;
            softmax_causal_columns(pt, st, len);
        }
    s->pt_op = as_op(s, OP_PT, s->pt, (long)g * S * S);

    for (int b = 0, g2 = 0; b < batch; b++)
        for (int hh = 0; hh < heads; hh++, g2++) {
            const int r0 = s->seq_start[b], len = s->seq_len[b];
            s->att_gemms[g2] = (emg_gemm){hd, len, len, s->vals_op + (long)r0 * d + hh * hd, d,
                                          s->pt_op + (long)g2 * S * S, S, s->attT + (long)hh * hd * n + r0, n,
                                          1.0f, 0, NULL, s->att + (long)r0 * d + hh * hd, d, NULL};
        }
    sme_gemm_many(s->att_gemms, g); /* att^T for the O projection, att (vertical readout) for dWo */
}

/* Attention backward as ZA-tile GEMMs, per (sequence, head), with the softmax backward in Neon between:
 *   dP^T[u][t] = sum_j V[u][j] datt[t][j]                  (A = V^T, B = datt^T)
 *   dS^T = P^T * (dP^T - colsum(P^T * dP^T)) * scale        (Neon, softmax_backward_columns; also dS, P)
 *   dQ[t][j] = sum_u dS^T[u][t] K[u][j]   dK[u][j] = sum_t dS[t][u] Q[t][j]   dV[u][j] = sum_t P[t][u] datt[t][j]
 * Every operand arrives in the layout its product contracts over, with no re-layout pass: V^T, datt^T and
 * Q|K position-major from vertical ZA readouts, dS^T, dS and P from the softmax backward's registers.
 * The last three write straight into their column ranges of dqkv (position-major), in one session. */
static void attention_backward(emg_session *s, int batch) {
    const int n = s->n_rows, d = s->d, hd = s->hd, heads = s->h, w = 3 * s->d;
    const float scale = 1.0f / sqrtf((float)hd);
    /* V^T, datt^T and Q|K position-major were written by the vertical readouts of the GEMMs that made
     * vals, datt and q|k (seed #25/#28: each layout comes out of ZA, no transpose pass) */
    const op_t *v_t = as_op(s, OP_VT, s->vT, (long)d * n), *datt_t = as_op(s, OP_DATTT, s->dattT, (long)d * n);
    const op_t *datt = as_op(s, OP_DATT, s->datt, (long)n * d), *qk_pm = as_op(s, OP_QKPM, s->qk_pm, 2L * n * d);

    int g = 0;
    for (int b = 0; b < batch; b++)
        for (int hh = 0; hh < heads; hh++, g++) {
            const int r0 = s->seq_start[b], len = s->seq_len[b];
            const long col = (long)hh * hd * n + r0;
            s->att_gemms[g] = (emg_gemm){len, len, hd, v_t + col, n, datt_t + col, n, s->scores + (long)g * S * S, S,
                                         1.0f, 0, NULL, NULL, 0, NULL};
        }
    sme_gemm_many(s->att_gemms, g);

    for (int b = 0, g2 = 0; b < batch; b++)
        for (int hh = 0; hh < heads; hh++, g2++) {
            const long blk = (long)g2 * S * S; /* scores: dP^T in, dS^T out */
            softmax_backward_columns(s->scores + blk, s->ds_blk + blk, s->p_blk + blk, s->pt + blk, s->seq_len[b],
                                     scale);
        }
    const long blocks = (long)g * S * S;
    const op_t *ds_t = as_op(s, OP_DST, s->scores, blocks), *ds = as_op(s, OP_DS, s->ds_blk, blocks);
    const op_t *p = as_op(s, OP_P, s->p_blk, blocks);

    emg_gemm *dq = s->att_gemms, *dk = dq + g, *dv = dk + g;
    for (int b = 0, g2 = 0; b < batch; b++)
        for (int hh = 0; hh < heads; hh++, g2++) {
            const int r0 = s->seq_start[b], len = s->seq_len[b];
            const long blk = (long)g2 * S * S, out = (long)r0 * w + hh * hd, in = (long)r0 * 2 * d + hh * hd;
            /* dqkv^T (vertical readout into tA) is the k-major operand of the dh1 GEMM */
            float *t = s->tA + (long)hh * hd * n + r0;
            dq[g2] = (emg_gemm){len, hd, len, ds_t + blk, S, qk_pm + in + d, 2 * d, s->dqkv + out, w, 1.0f, 0, NULL,
                                t, n, NULL};
            dk[g2] = (emg_gemm){len, hd, len, ds + blk, S, qk_pm + in, 2 * d, s->dqkv + out + d, w, 1.0f, 0, NULL,
                                t + (long)d * n, n, NULL};
            dv[g2] = (emg_gemm){len, hd, len, p + blk, S, datt + (long)r0 * d + hh * hd, d, s->dqkv + out + 2 * d, w,
                                1.0f, 0, NULL, t + 2L * d * n, n, NULL};
        }
    sme_gemm_many(s->att_gemms, 3 * g);
}

/* ---- the step -------------------------------------------------------------------------------- */

static void pack_batch(emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths) {
    int n = 0;
    for (int b = 0; b < batch; b++) {
        const uint8_t *tok = tokens + (long)b * S;
        s->seq_start[b] = n;
        s->seq_len[b] = lengths[b] - 1;
        for (int t = 0; t < lengths[b] - 1; t++, n++) {
            s->row_tok[n] = tok[t];
            s->row_pos[n] = (uint8_t)t;
            s->row_tgt[n] = tok[t + 1];
        }
    }
    s->n_rows = n;
}

/* Forward over the packed rows; returns the summed loss and leaves dlogits in s->dlog. */
static double forward(emg_session *s, int batch) {
    const int n = s->n_rows, d = s->d, f = s->f;
    const float *tok_emb = s->p + s->o_tok, *pos_emb = s->p + s->o_pos;
    for (int r = 0; r < n; r++) {
        const float *te = tok_emb + s->row_tok[r] * d, *pe = pos_emb + s->row_pos[r] * d;
        float *x = s->x1 + (long)r * d;
        for (int i = 0; i < d; i += 4) vst1q_f32(x + i, vaddq_f32(vld1q_f32(te + i), vld1q_f32(pe + i)));
    }
    rms_forward(s->x0, s->r0, s->x1, n, d);
    rms_forward(s->h1, s->r1, s->x0, n, d);

    /* q and k come out feature-major (A = W^T, B = h1^T), v position-major (A = h1^T, B = W^T) */
    transpose_op(s->opT, s->h1, n, d);
    gemm_t(2 * d, n, d, s->t_qkv, 3 * d, s->opT, n, s->qk, n, 0, NULL, s->qk_pm, NULL);
    gemm_t(n, d, d, s->opT, n, s->t_qkv + 2 * d, 3 * d, s->vals, d, 0, NULL, s->vT, NULL);
    s->qk_op = as_op(s, OP_QK, s->qk, 2L * d * n);
    s->vals_op = as_op(s, OP_VALS, s->vals, (long)n * d);
    attention_forward(s, batch);

    memcpy(s->x1, s->x0, sizeof(float) * (size_t)n * d); /* residual, added in the GEMM readout */
    s->attT_op = as_op(s, OP_ATTT, s->attT, (long)d * n);
    gemm(n, d, d, s->attT_op, n, s->t_wo, d, s->x1, d, GEMM_ACC, NULL);

    rms_forward(s->h2, s->r2, s->x1, n, d);
    transpose_op(s->opT, s->h2, n, d);
    gemm_t(n, f, d, s->opT, n, s->t_f1, f, s->hid, f, GEMM_RELU, NULL, s->hidT, NULL); /* #26: no ReLU/transpose sweep */

    memcpy(s->x2, s->x1, sizeof(float) * (size_t)n * d);
    gemm(n, d, f, as_kmajor(s, s->hidT, (long)f * n), n, s->t_f2, d, s->x2, d, GEMM_ACC, NULL);

    transpose_op(s->opT, s->x2, n, d);
    gemm(n, V, d, s->opT, n, s->t_lm, V, s->logits, V, 0, NULL);

    /* cross-entropy and dlogits = softmax - onehot, in Neon: the 27 logits as seven vectors (the 28th lane a
     * copy of the first, for the max, and zero after the exp) */
    double loss = 0.0;
    for (int r = 0; r < n; r++) {
        const float *z = s->logits + (long)r * V;
        float *dz = s->dlog + (long)r * V;
        float zb[28], eb[28];
        memcpy(zb, z, sizeof(float) * V);
        zb[V] = z[0];
        float32x4_t mv = vld1q_f32(zb);
        for (int c = 4; c < 28; c += 4) mv = vmaxq_f32(mv, vld1q_f32(zb + c));
        const float mx = vmaxvq_f32(mv);
        float32x4_t sv = vdupq_n_f32(0.0f);
        for (int c = 0; c < 28; c += 4) {
            float32x4_t e = exp4(vsubq_f32(vld1q_f32(zb + c), vdupq_n_f32(mx)));
            if (c == 24) e = vsetq_lane_f32(0.0f, e, 3);
            vst1q_f32(eb + c, e);
            sv = vaddq_f32(sv, e);
        }
        const float sum = vaddvq_f32(sv), inv = 1.0f / sum;
        loss += (double)(logf(sum) - (z[s->row_tgt[r]] - mx));
        for (int c = 0; c < 24; c += 4) vst1q_f32(dz + c, vmulq_n_f32(vld1q_f32(eb + c), inv));
        for (int c = 24; c < V; c++) dz[c] = eb[c] * inv;
        dz[s->row_tgt[r]] -= 1.0f;
    }
    return loss;
}

/* Backward from s->dlog; writes the mean-loss gradient into s->g (every element). */
static void backward(emg_session *s, int batch) {
    const int n = s->n_rows, d = s->d, f = s->f;
    const float inv_n = 1.0f / (float)n;

    /* input-gradient chain: each GEMM reads the upstream gradient feature-major */
    /* input-gradient chain: each GEMM also reads its result out transposed (vertical ZA slices, seed
     * #28), which is the next GEMM's k-major operand; transposes remain only after Neon glue */
    transpose_op(s->opT, s->dlog, n, V);
    gemm_t(n, d, V, s->opT, n, s->w_lm, d, s->dx2, d, 0, NULL, s->tA, NULL);
    gemm_t(n, f, d, as_kmajor(s, s->tA, (long)d * n), n, s->w_f2, f, s->dpre, f, GEMM_GATE, s->hid, s->tB,
           s->hidT); /* ReLU backward in both readouts */
    gemm(n, d, f, as_kmajor(s, s->tB, (long)f * n), n, s->w_f1, d, s->dh2, d, 0, NULL);
    rms_backward(s->dx1, s->dx2, s->dh2, s->h2, s->r2, n, d);

    transpose_op(s->opT, s->dx1, n, d);
    gemm_t(n, d, d, s->opT, n, s->w_wo, d, s->datt, d, 0, NULL, s->dattT, NULL);
    attention_backward(s, batch);
    gemm(n, d, 3 * d, as_kmajor(s, s->tA, 3L * d * n), n, s->w_qkv, d, s->dh1, d, 0, NULL);
    rms_backward(s->dh1, s->dx1, s->dh1, s->h1, s->r1, n, d);   /* dh1 := d(loss)/d(x0) */
    rms_backward(s->dh1, NULL, s->dh1, s->x0, s->r0, n, d);     /* dh1 := d(loss)/d(embedding) */

    /* All weight gradients in one streaming session, contracting over every packed row at once;
     * 1/N is applied in the readout. Operand pairs: (upstream gradient, layer input). */
    const float *pairs[5][2] = {{s->dlog, s->x2}, {s->dx2, s->hid}, {s->dpre, s->h2}, {s->dx1, s->att},
                                {s->dqkv, s->h1}};
    const int dims[5][2] = {{V, d}, {d, f}, {f, d}, {d, d}, {3 * d, d}};
    float *outs[5] = {s->g + s->o_lm, s->g + s->o_f2, s->g + s->o_f1, s->g + s->o_wo, s->g + s->o_qkv};
    emg_gemm wg[5];
#if EMG_SME_F16
    op_t *cursor = s->h_act;
#endif
    for (int i = 0; i < 5; i++) {
        const int mdim = dims[i][0], kdim = dims[i][1];
#if EMG_SME_F16
        op_t *a = cursor, *b = cursor + (long)n * mdim;
        cursor = b + (long)n * kdim;
        to_f16(a, pairs[i][0], (long)n * mdim);
        to_f16(b, pairs[i][1], (long)n * kdim);
#else
        const op_t *a = pairs[i][0], *b = pairs[i][1];
#endif
        wg[i] = (emg_gemm){mdim, kdim, n, a, mdim, b, kdim, outs[i], kdim, inv_n, 0, NULL, NULL, 0, NULL};
    }
    sme_gemm_many(wg, 5);

    float *g_tok = s->g + s->o_tok, *g_pos = s->g + s->o_pos;
    memset(g_tok, 0, sizeof(float) * (size_t)(V + S) * d); /* tok_emb and pos_emb are adjacent */
    for (int r = 0; r < n; r++) {
        const float *e = s->dh1 + (long)r * d;
        float *gt = g_tok + s->row_tok[r] * d, *gp = g_pos + s->row_pos[r] * d;
        for (int i = 0; i < d; i += 4) {
            const float32x4_t v = vmulq_n_f32(vld1q_f32(e + i), inv_n);
            vst1q_f32(gt + i, vaddq_f32(vld1q_f32(gt + i), v));
            vst1q_f32(gp + i, vaddq_f32(vld1q_f32(gp + i), v));
        }
    }
}

/* One Adam step over every parameter, four lanes at a time (the seed's Neon Adam): the same operations
 * as the scalar form (FMA for the moment updates, IEEE sqrt and divide), about 5 instructions per
 * parameter instead of 32 for the scalar loop that libm's sqrtf kept from vectorising. */
static void adam(emg_session *s, float lr) {
    const float c1 = (float)(1.0 - pow(EMG_ADAM_BETA1, (double)s->core.step)); /* the layer counted it */
    const float c2 = (float)(1.0 - pow(EMG_ADAM_BETA2, (double)s->core.step));
    const float a1 = (float)(1.0 - EMG_ADAM_BETA1), a2 = (float)(1.0 - EMG_ADAM_BETA2);
    float *restrict p = s->p, *restrict m = s->m, *restrict v = s->v;
    const float *restrict g = s->g;
    const float32x4_t b1v = vdupq_n_f32(EMG_ADAM_BETA1), b2v = vdupq_n_f32(EMG_ADAM_BETA2);
    const float32x4_t c1v = vdupq_n_f32(c1), c2v = vdupq_n_f32(c2), epsv = vdupq_n_f32(EMG_ADAM_EPS);
    const long n4 = s->n_params & ~3L;
    for (long i = 0; i < n4; i += 4) {
        const float32x4_t gi = vld1q_f32(g + i);
        const float32x4_t mi = vfmaq_n_f32(vmulq_f32(b1v, vld1q_f32(m + i)), gi, a1);
        const float32x4_t vi = vfmaq_f32(vmulq_f32(b2v, vld1q_f32(v + i)), vmulq_n_f32(gi, a2), gi);
        vst1q_f32(m + i, mi);
        vst1q_f32(v + i, vi);
        const float32x4_t den = vaddq_f32(vsqrtq_f32(vdivq_f32(vi, c2v)), epsv);
        vst1q_f32(p + i, vsubq_f32(vld1q_f32(p + i), vdivq_f32(vmulq_n_f32(vdivq_f32(mi, c1v), lr), den)));
    }
    for (long i = n4; i < s->n_params; i++) {
        m[i] = EMG_ADAM_BETA1 * m[i] + a1 * g[i];
        v[i] = EMG_ADAM_BETA2 * v[i] + a2 * g[i] * g[i];
        p[i] -= lr * (m[i] / c1) / (sqrtf(v[i] / c2) + EMG_ADAM_EPS);
    }
}

/* ---- the hooks of the shared session layer (emg_backend.h adds the exported ABI) ---------------- */

/* The seed enables SME2 from d_model 64: below it SMSTART/SMSTOP overhead beats the tiny tiles. */
static int supports(int d_model, int n_heads) {
    return (d_model == 64 || d_model == 128) && (n_heads == 4 || n_heads == 8);
}

static int init(emg_session *s) {
    if (emg_sme_cpu_status(EMG_SME_NEEDS_F16F16) != SME_CPU_OK) return EMG_ERR_UNSUPPORTED;
    const emg_core *c = &s->core;
    const emg_layout *L = &c->layout;
    const int d = c->d_model, f = 4 * c->d_model, n_heads = c->n_heads, max_batch = c->max_batch;
    const long rows = (long)max_batch * (S - 1);
    s->d = d, s->h = n_heads, s->hd = d / n_heads, s->f = f, s->max_rows = (int)rows;
    s->n_params = L->n_params;
    s->p = c->params, s->m = c->adam_m, s->v = c->adam_v, s->g = c->grads;
    s->o_tok = L->tok_emb, s->o_pos = L->pos_emb, s->o_qkv = L->wq, s->o_wo = L->wo, s->o_f1 = L->wf1;
    s->o_f2 = L->wf2, s->o_lm = L->wlm;

    const size_t fl = sizeof(float), R = (size_t)rows;
    s->t_qkv = session_alloc(s, sizeof(op_t) * 3 * d * d);
    s->t_wo = session_alloc(s, sizeof(op_t) * d * d);
    s->t_f1 = session_alloc(s, sizeof(op_t) * 4 * d * d);
    s->t_f2 = session_alloc(s, sizeof(op_t) * 4 * d * d);
    s->t_lm = session_alloc(s, sizeof(op_t) * V * d);
    s->seq_start = session_alloc(s, sizeof(int) * max_batch);
    s->seq_len = session_alloc(s, sizeof(int) * max_batch);
    s->row_tok = session_alloc(s, R);
    s->row_pos = session_alloc(s, R);
    s->row_tgt = session_alloc(s, R);
    struct { float **ptr; size_t width; } acts[] = {
        {&s->x0, d}, {&s->r0, 1}, {&s->h1, d}, {&s->r1, 1}, {&s->qk, 2 * d}, {&s->vals, d}, {&s->attT, d},
        {&s->vT, d}, {&s->dattT, d}, {&s->qk_pm, 2 * d},
        {&s->att, d}, {&s->x1, d}, {&s->h2, d}, {&s->r2, 1}, {&s->hid, f}, {&s->x2, d}, {&s->logits, V},
        {&s->dlog, V}, {&s->dx2, d}, {&s->dpre, f}, {&s->dh2, d}, {&s->dx1, d}, {&s->datt, d},
        {&s->dqkv, 3 * d}, {&s->dh1, d}, {&s->hidT, f}, {&s->tA, 3 * d}, {&s->tB, f}};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) *acts[i].ptr = session_alloc(s, R * acts[i].width * fl);
    s->opT = session_alloc(s, sizeof(op_t) * R * f);
    const size_t blocks = (size_t)max_batch * n_heads * S * S;
    s->scores = session_alloc(s, fl * blocks);
    s->pt = session_alloc(s, fl * blocks);
    s->att_gemms = session_alloc(s, sizeof(emg_gemm) * 3 * max_batch * n_heads);
    s->p_blk = session_alloc(s, fl * blocks);
    s->ds_blk = session_alloc(s, fl * blocks);
#if EMG_SME_F16
    s->h_w = session_alloc(s, sizeof(op_t) * (size_t)(s->n_params - s->o_qkv));
    /* widths of the five (gradient, input) pairs: (V+d) + (d+f) + (f+d) + (d+d) + (3d+d) */
    s->h_act = session_alloc(s, sizeof(op_t) * R * (V + 9 * d + 2 * f));
    const size_t op_sizes[OP_N] = {[OP_QK] = R * 2 * d, [OP_VALS] = R * d, [OP_PT] = blocks, [OP_ATTT] = R * d,
                                   [OP_VT] = R * d, [OP_DATTT] = R * d, [OP_DATT] = R * d, [OP_QKPM] = R * 2 * d,
                                   [OP_DST] = blocks, [OP_DS] = blocks, [OP_P] = blocks};
    for (int i = 0; i < OP_N; i++) s->h_ops[i] = session_alloc(s, sizeof(op_t) * op_sizes[i]);
    op_t *hw = s->h_w;
    const long base = s->o_qkv;
    s->w_qkv = hw, s->w_wo = hw + (s->o_wo - base), s->w_f1 = hw + (s->o_f1 - base);
    s->w_f2 = hw + (s->o_f2 - base), s->w_lm = hw + (s->o_lm - base);
#else
    s->w_qkv = s->p + s->o_qkv, s->w_wo = s->p + s->o_wo, s->w_f1 = s->p + s->o_f1;
    s->w_f2 = s->p + s->o_f2, s->w_lm = s->p + s->o_lm;
#endif
    return s->alloc_failed ? EMG_ERR_NOMEM : EMG_OK;
}

static void release(emg_session *s) { session_free(s); }

static float loss_and_grad(emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths,
                           int want_grads) {
    pack_batch(s, batch, tokens, lengths);
    const float loss = (float)(forward(s, batch) / s->n_rows);
    if (want_grads) backward(s, batch);
    return loss;
}

/* Designated: the optional hooks (train_step, set_threads) stay NULL, and later hooks need no edit. */
const emg_backend emg_this_backend = {.supports = supports, .init = init, .release = release,
                                      .params_changed = refresh_weight_operands, .loss_and_grad = loss_and_grad,
                                      .adam = adam};

#define EMG_BACKEND_IMPLEMENTATION
#include "emg_backend.h"
