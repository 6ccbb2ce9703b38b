/*
 * The training step of the SME2 backends (native ABI of eemicrogpt.h). C and Neon intrinsics, never
 * streaming; every matrix product goes to the FMOPA engine in sme2_gemm.c.
 *
 * Layout: live (batch, position) rows are packed densely, row n = one position that predicts a token,
 * so every GEMM runs over N = sum(len - 1) rows with only the last partial tile masked. Activations are
 * kept position-major [N][width]. The GEMM operand that must be k-major (feature-major) comes, where a
 * GEMM produced it, from that GEMM's vertical ZA readout (emg_gemm.Ct), and otherwise from a Neon 4x4
 * transpose into a shared scratch (opT). Each layer keeps what its backward reads (struct layer_acts);
 * the backward runs the layers in reverse on the gradient of the summed loss (dlogits = softmax - onehot,
 * O(1) per row): that is loss scaling for the fp16 builds, and 1/N is applied once, in the fp32 readout
 * of the weight gradients.
 *
 * Sizes in the buffer comments: N packed rows (at most max_batch * C), D = d_model, F = 4D, V = vocab,
 * Vp = V rounded up to 4, C = context, H heads of Dh = D / H, and per (sequence, head) pair a square
 * attention block of Bk = C rounded up to 4 (G = batch * H blocks).
 */
#include <arm_neon.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arm_adam.h"
#include "arm_neon_math.h"
#include "arm_rmsnorm.h"
#include "emg_backend.h"
#include "sme2_internal.h"

/* dot_f32's summation order in the RMS norms: four accumulators (d_model is a multiple of 16 here). */
#define DOT_CHAINS 4

/* Context and depth run to the ABI's bounds: the per-layer tables are sized by EMG_MAX_LAYERS, and a row's
 * position (0..C-1) is kept in a uint8_t. */
_Static_assert(EMG_MAX_CONTEXT <= 256, "row_pos holds a position in a uint8_t");

#define MAX_ALLOCS (48 + 16 * EMG_MAX_LAYERS)

/* The attention operands that need an fp16 copy in the fp16 build (see as_op). */
enum att_op { OP_QK, OP_VALS, OP_PT, OP_ATTT, OP_VT, OP_DATTT, OP_DATT, OP_QKPM, OP_DST, OP_DS, OP_P, OP_N };

/* One layer's weight operands. */
struct layer_weights {
    long o_qkv, o_wo, o_f1, o_f2; /* offsets of Wq (Wq|Wk|Wv are one (3D, D) matrix), Wo, Wf1, Wf2 */
    /* k-major copies (W transposed), rebuilt after every parameter change */
    op_t *t_qkv; /* (D, 3D) */
    op_t *t_wo;  /* (D, D) */
    op_t *t_f1;  /* (D, F) */
    op_t *t_f2;  /* (F, D) */
    /* row-major weights for the backward input gradients: views of the parameters in the fp32 build, of
     * their fp16 copy in the fp16 builds */
    const op_t *w_qkv, *w_wo, *w_f1, *w_f2; /* (3D, D), (D, D), (F, D), (D, F) */
};

/* What one layer's forward leaves for its backward. */
struct layer_acts {
    float *h1, *r1;    /* (N, D), (N): rms(x) entering attention, and 1/rms */
    float *vT;         /* (D, N): V feature-major (vertical readout of the V GEMM; the dP operand) */
    float *qk_pm;      /* (N, 2D): Q|K position-major (vertical readout of the Q|K GEMM; dQ, dK operands) */
    float *pt;         /* (G, Bk, Bk): P^T, the causal softmax, per (sequence, head) */
    float *att;        /* (N, D): attention output before Wo (vertical readout of att^T; the dWo operand) */
    float *h2, *r2;    /* (N, D), (N): rms(x) entering the MLP, and 1/rms */
    float *hid, *hidT; /* (N, F), (F, N): relu(Wf1 h2), and transposed (the ReLU-backward gates) */
};

struct emg_session {
    emg_core core; /* shape, layout, step and the training state: owned by the shared layer */
    /* the kernels' short names for core's fields, set once by init */
    int d, h, hd, f, n_layers, vocab, vocab_pad, context, blk, max_rows;
    long n_params;
    float *p, *m, *v, *g; /* params, Adam moments, gradient: the ABI layout */
    long o_tok, o_pos, o_lm;
    struct layer_weights lw[EMG_MAX_LAYERS];
    struct layer_acts la[EMG_MAX_LAYERS];
    op_t *t_lm;       /* (D, V): Wlm transposed */
    const op_t *w_lm; /* (V, D) */
    /* the packed batch */
    int n_rows;
    int *seq_start, *seq_len; /* (batch): first packed row and live positions of each sequence */
    uint8_t *row_tok, *row_pos, *row_tgt; /* (N): input token, position and target of each row */
    /* forward scratch, one layer at a time */
    float *x0, *r0;   /* (N, D), (N): rms(tok_emb + pos_emb), the first layer's input, and 1/rms */
    float *x;         /* (N, D): the residual stream (the embedding sum, then each layer adds into it) */
    float *qk;        /* (2D, N): Q|K feature-major (the score GEMM's operands) */
    float *vals;      /* (N, D): V position-major (the value GEMM's operand) */
    float *scores;    /* (G, Bk, Bk): S^T in the forward; dP^T, then dS^T in place, in the backward */
    float *attT;      /* (D, N): att^T (the Wo GEMM's k-major operand) */
    float *logits;    /* (N, Vp) */
    emg_gemm *att_gemms; /* (3G): descriptors per (sequence, head), each product set in one streaming session */
    /* backward scratch: gradients of the summed loss */
    float *dlog;          /* (N, V) */
    float *dres, *din;    /* (N, D) each: the residual stream's gradient after and before a layer (swapped) */
    float *dpre, *dh2;    /* (N, F), (N, D): at the MLP's pre-activation and its input */
    float *dmid;          /* (N, D): the residual stream's gradient between attention and the MLP */
    float *datt, *dattT;  /* (N, D), (D, N): at the attention output */
    float *dqkv;          /* (N, 3D) */
    float *p_blk, *ds_blk; /* (G, Bk, Bk): P and dS t-major (the dV and dK operands) */
    op_t *opT; /* (max(F, 3D, V), N): feature-major operand scratch */
    /* fp32 feature-major results that a GEMM's vertical ZA readout wrote beside its position-major one
     * (emg_gemm.Ct), handed on as the next GEMM's k-major operand */
    float *tA; /* (3D, N): dres^T, then dqkv^T */
    float *tB; /* (F, N): dpre^T */
    const op_t *qk_op, *vals_op, *pt_op, *attT_op; /* GEMM operand views of four forward buffers */
#if EMG_SME_F16
    op_t *h_w;         /* every layer's weights and Wlm in fp16 (the w_* point into it) */
    op_t *h_ops[OP_N]; /* fp16 copies of the attention operands, see enum att_op */
    op_t *h_act;       /* fp16 copies of the position-major weight-gradient operands */
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
 * blocks transposed in registers; the ragged right and bottom edges (a packed row count, a vocabulary
 * that is not a multiple of 4) are scalar. Callers pass a constant `half`, so each use compiles to one
 * specialised loop. */
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
    for (int l = 0; l < s->n_layers; l++) {
        const struct layer_weights *w = &s->lw[l];
        transpose_op(w->t_qkv, s->p + w->o_qkv, 3 * d, d);
        transpose_op(w->t_wo, s->p + w->o_wo, d, d);
        transpose_op(w->t_f1, s->p + w->o_f1, f, d);
        transpose_op(w->t_f2, s->p + w->o_f2, d, f);
    }
    transpose_op(s->t_lm, s->p + s->o_lm, s->vocab, d);
#if EMG_SME_F16
    /* Every layer's weights and Wlm are contiguous in the layout: one conversion covers all row-major
     * operands. */
    const long first = s->lw[0].o_qkv;
    to_f16(s->h_w, s->p + first, s->n_params - first);
#endif
}

/* ---- elementwise pieces -------------------------------------------------------------------- */

/* Neon glue outside streaming mode (with the helpers shared with neon: arm_neon_math.h, arm_rmsnorm.h,
 * arm_adam.h). Widths are multiples of 16 (d_model) unless said otherwise; the softmax exp is the degree-7
 * exp_f32x4. */

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
 * block with rows ld apart, len live rows and columns. Neon across four columns at a time (rows are
 * contiguous in t), lanes with u > t masked; each column's max and sum run over u in order as in the
 * scalar form. Lanes of columns >= len compute on stale, finite scores and are never read. */
static void causal_softmax_forward(float *restrict pt, const float *restrict st, int len, int ld) {
    const float32x4_t ninf = vdupq_n_f32(-INFINITY), zero = vdupq_n_f32(0.0f);
    const uint32x4_t lane = {0, 1, 2, 3};
    for (int t0 = 0; t0 < len; t0 += 4) {
        const uint32x4_t tv = vaddq_u32(lane, vdupq_n_u32((uint32_t)t0));
        const int live = t0 + 4 < len ? t0 + 4 : len; /* rows u < live have a lane with u <= t */
        float32x4_t mx = ninf, sum = zero;
        for (int u = 0; u < live; u++) {
            const uint32x4_t ok = vcleq_u32(vdupq_n_u32((uint32_t)u), tv);
            mx = vmaxq_f32(mx, vbslq_f32(ok, vld1q_f32(st + u * ld + t0), ninf));
        }
        for (int u = 0; u < live; u++) {
            const uint32x4_t ok = vcleq_u32(vdupq_n_u32((uint32_t)u), tv);
            const float32x4_t e = vbslq_f32(ok, exp_f32x4(vsubq_f32(vld1q_f32(st + u * ld + t0), mx), 7), zero);
            vst1q_f32(pt + u * ld + t0, e);
            sum = vaddq_f32(sum, e);
        }
        const float32x4_t inv = vdivq_f32(vdupq_n_f32(1.0f), sum);
        for (int u = 0; u < live; u++) vst1q_f32(pt + u * ld + t0, vmulq_f32(vld1q_f32(pt + u * ld + t0), inv));
        for (int u = live; u < len; u++) vst1q_f32(pt + u * ld + t0, zero);
    }
}

/* The causal softmax backward of one block (rows ld apart), in Neon across four columns t at a time, the
 * layout the forward left P^T in (u-major, t contiguous):
 *   c[t] = sum_{u <= t} P^T[u][t] dP^T[u][t]           (over u in order, one lane per t: a fixed order)
 *   dS^T[u][t] = P^T[u][t] (dP^T[u][t] - c[t]) scale    (u <= t; exactly 0 above the diagonal)
 * dS^T overwrites dP^T (the operand of dQ, contracting over u). The operands of dK and dV contract over t,
 * so they are t-major: each 4x4 block of dS^T and of P^T leaves the registers it was computed or loaded in
 * a second time, transposed by TRN, as dS[t][u] and P[t][u]. No pass re-reads a block.
 * Rows and columns run to len rounded up to 4 (<= ld); P^T is 0 for u > t, so lanes with u > t add exact
 * zeros to c, and 4x4 blocks wholly above the diagonal (the causal GEMMs still read those within their
 * register blocks) are stored as zeros without computing them. Lanes of columns or rows >= len compute on
 * stale, finite values and are never read. */
static void causal_softmax_backward(float *restrict dst, float *restrict ds, float *restrict p,
                                    const float *restrict pt, int len, int ld, float scale) {
    const float32x4_t zero = vdupq_n_f32(0.0f);
    const uint32x4_t lane = {0, 1, 2, 3};
    const int len4 = (len + 3) & ~3;
    for (int t0 = 0; t0 < len; t0 += 4) {
        const uint32x4_t tv = vaddq_u32(lane, vdupq_n_u32((uint32_t)t0));
        const int live = t0 + 4 < len ? t0 + 4 : len; /* rows u < live have a lane with u <= t */
        float32x4_t c = zero;
        for (int u = 0; u < live; u++) c = vfmaq_f32(c, vld1q_f32(pt + u * ld + t0), vld1q_f32(dst + u * ld + t0));
        for (int u0 = 0; u0 < len4; u0 += 4) {
            if (u0 > t0) { /* every u of these rows is past every t of these columns: dS and P are 0 there */
                for (int i = 0; i < 4; i++) {
                    vst1q_f32(dst + (u0 + i) * ld + t0, zero);
                    vst1q_f32(ds + (t0 + i) * ld + u0, zero);
                    vst1q_f32(p + (t0 + i) * ld + u0, zero);
                }
                continue;
            }
            float32x4_t pr[4], dr[4];
            for (int i = 0; i < 4; i++) {
                const int u = u0 + i;
                const uint32x4_t ok = vcleq_u32(vdupq_n_u32((uint32_t)u), tv);
                pr[i] = vld1q_f32(pt + u * ld + t0);
                const float32x4_t v = vmulq_n_f32(vmulq_f32(pr[i], vsubq_f32(vld1q_f32(dst + u * ld + t0), c)), scale);
                dr[i] = vbslq_f32(ok, v, zero);
                vst1q_f32(dst + u * ld + t0, dr[i]);
            }
            const float32x4x4_t dsb = transpose4x4_regs(dr[0], dr[1], dr[2], dr[3]);
            const float32x4x4_t pb = transpose4x4_regs(pr[0], pr[1], pr[2], pr[3]);
            for (int i = 0; i < 4; i++) {
                vst1q_f32(ds + (t0 + i) * ld + u0, dsb.val[i]);
                vst1q_f32(p + (t0 + i) * ld + u0, pb.val[i]);
            }
        }
    }
}

/* Attention as ZA-tile GEMMs, every (sequence, head) pair in one streaming session per product:
 *   S^T[u][t] = scale * sum_j K[u][j] Q[t][j]      (A = K^T, B = Q^T: both feature-major, from the QKV GEMM)
 *   P^T = causal softmax over u of each column t    (C, outside streaming mode)
 *   att^T[j][t] = sum_u V[u][j] P^T[u][t]           (A = V position-major, B = P^T; written into att^T)
 * Computing S transposed makes P^T, the k-major operand of the value product, come out directly. Each
 * product skips what the causal mask zeroes (emg_gemm.causal): blocks above the diagonal, or the part of a
 * contraction past it. */
static void attention_forward(emg_session *s, int batch, const struct layer_acts *a) {
    const int n = s->n_rows, d = s->d, hd = s->hd, heads = s->h, bk = s->blk;
    const long blk_size = (long)bk * bk;
    const float scale = 1.0f / sqrtf((float)hd);
    const op_t *q_t = s->qk_op, *k_t = s->qk_op + (long)d * n;
    int g = 0;
    for (int b = 0; b < batch; b++)
        for (int hh = 0; hh < heads; hh++, g++) {
            const int r0 = s->seq_start[b], len = s->seq_len[b];
            const long col = (long)hh * hd * n + r0;
            s->att_gemms[g] = (emg_gemm){.M = len, .N = len, .K = hd, .A = k_t + col, .lda = n, .B = q_t + col,
                                         .ldb = n, .C = s->scores + g * blk_size, .ldc = bk, .alpha = scale,
                                         .causal = CAUSAL_UPPER};
        }
    sme_gemm_many(s->att_gemms, g);

    for (int b = 0, g2 = 0; b < batch; b++)
        for (int hh = 0; hh < heads; hh++, g2++)
            causal_softmax_forward(a->pt + g2 * blk_size, s->scores + g2 * blk_size, s->seq_len[b], bk);
    s->pt_op = as_op(s, OP_PT, a->pt, g * blk_size);

    for (int b = 0, g2 = 0; b < batch; b++)
        for (int hh = 0; hh < heads; hh++, g2++) {
            const int r0 = s->seq_start[b], len = s->seq_len[b];
            const long pos = (long)r0 * d + hh * hd; /* (row r0, head hh's first column) of an (N, D) array */
            /* att^T for the O projection, att (vertical readout) for dWo */
            s->att_gemms[g2] = (emg_gemm){.M = hd, .N = len, .K = len, .A = s->vals_op + pos, .lda = d,
                                          .B = s->pt_op + g2 * blk_size, .ldb = bk,
                                          .C = s->attT + (long)hh * hd * n + r0, .ldc = n, .alpha = 1.0f,
                                          .Ct = a->att + pos, .ldct = d, .causal = CAUSAL_K_TO_N};
        }
    sme_gemm_many(s->att_gemms, g);
}

/* Attention backward as ZA-tile GEMMs, per (sequence, head), with the softmax backward in Neon between:
 *   dP^T[u][t] = sum_j V[u][j] datt[t][j]                  (A = V^T, B = datt^T)
 *   dS^T = P^T * (dP^T - colsum(P^T * dP^T)) * scale        (Neon, causal_softmax_backward; also dS, P)
 *   dQ[t][j] = sum_u dS^T[u][t] K[u][j]   dK[u][j] = sum_t dS[t][u] Q[t][j]   dV[u][j] = sum_t P[t][u] datt[t][j]
 * Every operand arrives in the layout its product contracts over, with no re-layout pass: V^T, datt^T and
 * Q|K position-major from vertical ZA readouts, dS^T, dS and P from the softmax backward's registers.
 * The last three write straight into their column ranges of dqkv (position-major), in one session, and
 * dqkv^T into tA (vertical readouts): the k-major operand of the layer input's gradient. */
static void attention_backward(emg_session *s, int batch, const struct layer_acts *a) {
    const int n = s->n_rows, d = s->d, hd = s->hd, heads = s->h, w = 3 * s->d, bk = s->blk;
    const long blk_size = (long)bk * bk;
    const float scale = 1.0f / sqrtf((float)hd);
    const op_t *v_t = as_op(s, OP_VT, a->vT, (long)d * n), *datt_t = as_op(s, OP_DATTT, s->dattT, (long)d * n);
    const op_t *datt = as_op(s, OP_DATT, s->datt, (long)n * d), *qk_pm = as_op(s, OP_QKPM, a->qk_pm, 2L * n * d);

    int g = 0;
    for (int b = 0; b < batch; b++)
        for (int hh = 0; hh < heads; hh++, g++) {
            const int r0 = s->seq_start[b], len = s->seq_len[b];
            const long col = (long)hh * hd * n + r0;
            s->att_gemms[g] = (emg_gemm){.M = len, .N = len, .K = hd, .A = v_t + col, .lda = n, .B = datt_t + col,
                                         .ldb = n, .C = s->scores + g * blk_size, .ldc = bk, .alpha = 1.0f,
                                         .causal = CAUSAL_UPPER};
        }
    sme_gemm_many(s->att_gemms, g);

    for (int b = 0, g2 = 0; b < batch; b++)
        for (int hh = 0; hh < heads; hh++, g2++) {
            const long blk = g2 * blk_size; /* scores: dP^T in, dS^T out */
            causal_softmax_backward(s->scores + blk, s->ds_blk + blk, s->p_blk + blk, a->pt + blk, s->seq_len[b],
                                    bk, scale);
        }
    const long blocks = g * blk_size;
    const op_t *ds_t = as_op(s, OP_DST, s->scores, blocks), *ds = as_op(s, OP_DS, s->ds_blk, blocks);
    const op_t *p = as_op(s, OP_P, s->p_blk, blocks);

    emg_gemm *dq = s->att_gemms, *dk = dq + g, *dv = dk + g;
    for (int b = 0, g2 = 0; b < batch; b++)
        for (int hh = 0; hh < heads; hh++, g2++) {
            const int r0 = s->seq_start[b], len = s->seq_len[b];
            const long blk = g2 * blk_size, out = (long)r0 * w + hh * hd, in = (long)r0 * 2 * d + hh * hd;
            float *t = s->tA + (long)hh * hd * n + r0;
            dq[g2] = (emg_gemm){.M = len, .N = hd, .K = len, .A = ds_t + blk, .lda = bk, .B = qk_pm + in + d,
                                .ldb = 2 * d, .C = s->dqkv + out, .ldc = w, .alpha = 1.0f, .Ct = t, .ldct = n,
                                .causal = CAUSAL_K_TO_M};
            dk[g2] = (emg_gemm){.M = len, .N = hd, .K = len, .A = ds + blk, .lda = bk, .B = qk_pm + in,
                                .ldb = 2 * d, .C = s->dqkv + out + d, .ldc = w, .alpha = 1.0f,
                                .Ct = t + (long)d * n, .ldct = n, .causal = CAUSAL_K_FROM_M};
            dv[g2] = (emg_gemm){.M = len, .N = hd, .K = len, .A = p + blk, .lda = bk,
                                .B = datt + (long)r0 * d + hh * hd, .ldb = d, .C = s->dqkv + out + 2 * d, .ldc = w,
                                .alpha = 1.0f, .Ct = t + 2L * d * n, .ldct = n, .causal = CAUSAL_K_FROM_M};
        }
    sme_gemm_many(s->att_gemms, 3 * g);
}

/* ---- the step -------------------------------------------------------------------------------- */

static void pack_batch(emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths) {
    const int seq = emg_seq_len(&s->core.shape);
    int n = 0;
    for (int b = 0; b < batch; b++) {
        const uint8_t *tok = tokens + (long)b * seq;
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

/* x = tok_emb[token] + pos_emb[position] per row; x0 = rms(x), and the residual stream starts as x0 (x0 is
 * kept for the first norm's backward). */
static void encoder_forward(emg_session *s) {
    const int n = s->n_rows, d = s->d;
    const float *tok_emb = s->p + s->o_tok, *pos_emb = s->p + s->o_pos;
    for (int r = 0; r < n; r++) {
        const float *te = tok_emb + s->row_tok[r] * d, *pe = pos_emb + s->row_pos[r] * d;
        float *x = s->x + (long)r * d;
        for (int i = 0; i < d; i += 4) vst1q_f32(x + i, vaddq_f32(vld1q_f32(te + i), vld1q_f32(pe + i)));
    }
    rmsnorm_forward(s->x0, s->r0, s->x, n, d, DOT_CHAINS);
    memcpy(s->x, s->x0, sizeof(float) * (size_t)n * d);
}

/* d(tok_emb), d(pos_emb) from the gradient at the encoder's sum (dx, unscaled): scattered per row. */
static void encoder_backward(emg_session *s, const float *dx, float inv_n) {
    const int n = s->n_rows, d = s->d;
    float *g_tok = s->g + s->o_tok, *g_pos = s->g + s->o_pos;
    memset(g_tok, 0, sizeof(float) * (size_t)(s->vocab + s->context) * d); /* tok_emb and pos_emb are adjacent */
    for (int r = 0; r < n; r++) {
        const float *e = dx + (long)r * d;
        float *gt = g_tok + s->row_tok[r] * d, *gp = g_pos + s->row_pos[r] * d;
        for (int i = 0; i < d; i += 4) {
            const float32x4_t v = vmulq_n_f32(vld1q_f32(e + i), inv_n);
            vst1q_f32(gt + i, vaddq_f32(vld1q_f32(gt + i), v));
            vst1q_f32(gp + i, vaddq_f32(vld1q_f32(gp + i), v));
        }
    }
}

/* One layer on the residual stream s->x, in place: x += Wo attn(rms(x)); x += Wf2 relu(Wf1 rms(x)). The
 * residual adds happen in the GEMM readouts (GEMM_ACC). */
static void layer_forward(emg_session *s, int batch, int l) {
    const int n = s->n_rows, d = s->d, f = s->f;
    const struct layer_weights *w = &s->lw[l];
    const struct layer_acts *a = &s->la[l];
    rmsnorm_forward(a->h1, a->r1, s->x, n, d, DOT_CHAINS);

    /* q and k come out feature-major (A = W^T, B = h1^T), v position-major (A = h1^T, B = W^T) */
    transpose_op(s->opT, a->h1, n, d);
    sme_gemm(&(emg_gemm){.M = 2 * d, .N = n, .K = d, .A = w->t_qkv, .lda = 3 * d, .B = s->opT, .ldb = n,
                         .C = s->qk, .ldc = n, .alpha = 1.0f, .Ct = a->qk_pm, .ldct = 2 * d});
    sme_gemm(&(emg_gemm){.M = n, .N = d, .K = d, .A = s->opT, .lda = n, .B = w->t_qkv + 2 * d, .ldb = 3 * d,
                         .C = s->vals, .ldc = d, .alpha = 1.0f, .Ct = a->vT, .ldct = n});
    s->qk_op = as_op(s, OP_QK, s->qk, 2L * d * n);
    s->vals_op = as_op(s, OP_VALS, s->vals, (long)n * d);
    attention_forward(s, batch, a);

    s->attT_op = as_op(s, OP_ATTT, s->attT, (long)d * n);
    sme_gemm(&(emg_gemm){.M = n, .N = d, .K = d, .A = s->attT_op, .lda = n, .B = w->t_wo, .ldb = d, .C = s->x,
                         .ldc = d, .alpha = 1.0f, .flags = GEMM_ACC});

    rmsnorm_forward(a->h2, a->r2, s->x, n, d, DOT_CHAINS);
    transpose_op(s->opT, a->h2, n, d);
    /* hid with the ReLU fused into the readout, and hid^T (vertical readout): the contract GEMM's k-major
     * operand, so no separate ReLU or transpose pass */
    sme_gemm(&(emg_gemm){.M = n, .N = f, .K = d, .A = s->opT, .lda = n, .B = w->t_f1, .ldb = f, .C = a->hid,
                         .ldc = f, .alpha = 1.0f, .flags = GEMM_RELU, .Ct = a->hidT, .ldct = n});
    sme_gemm(&(emg_gemm){.M = n, .N = d, .K = f, .A = as_kmajor(s, a->hidT, (long)f * n), .lda = n, .B = w->t_f2,
                         .ldb = d, .C = s->x, .ldc = d, .alpha = 1.0f, .flags = GEMM_ACC});
}

/* Cross-entropy of each row's logits against its target, and dlogits = softmax - onehot, in Neon over
 * the Vp/4 vectors of a logits row. In the last vector, lanes past the vocabulary take the row's first
 * logit for the max and are zeroed after the exp. Returns the summed loss. */
static double crossentropy_forward_backward(emg_session *s) {
    const int n = s->n_rows, vocab = s->vocab, vp = s->vocab_pad, full = vocab & ~3;
    const uint32x4_t lane = {0, 1, 2, 3};
    const uint32x4_t in_vocab = vcltq_u32(lane, vdupq_n_u32((uint32_t)(vocab - full))); /* the last vector's */
    const float32x4_t zero = vdupq_n_f32(0.0f);
    float eb[EMG_MAX_VOCAB];
    double loss = 0.0;
    for (int r = 0; r < n; r++) {
        const float *z = s->logits + (long)r * vp;
        float *dz = s->dlog + (long)r * vocab;
        float32x4_t mv = vld1q_f32(z);
        if (full == 0) mv = vbslq_f32(in_vocab, mv, vdupq_n_f32(z[0]));
        for (int c = 4; c < full; c += 4) mv = vmaxq_f32(mv, vld1q_f32(z + c));
        if (full && full < vocab) mv = vmaxq_f32(mv, vbslq_f32(in_vocab, vld1q_f32(z + full), vdupq_n_f32(z[0])));
        const float mx = vmaxvq_f32(mv);
        const float32x4_t mxv = vdupq_n_f32(mx);
        float32x4_t sv = zero;
        for (int c = 0; c < full; c += 4) {
            const float32x4_t e = exp_f32x4(vsubq_f32(vld1q_f32(z + c), mxv), 7);
            vst1q_f32(eb + c, e);
            sv = vaddq_f32(sv, e);
        }
        if (full < vocab) {
            const float32x4_t e = vbslq_f32(in_vocab, exp_f32x4(vsubq_f32(vld1q_f32(z + full), mxv), 7), zero);
            vst1q_f32(eb + full, e);
            sv = vaddq_f32(sv, e);
        }
        const float sum = vaddvq_f32(sv), inv = 1.0f / sum;
        loss += (double)(logf(sum) - (z[s->row_tgt[r]] - mx));
        for (int c = 0; c < full; c += 4) vst1q_f32(dz + c, vmulq_n_f32(vld1q_f32(eb + c), inv));
        for (int c = full; c < vocab; c++) dz[c] = eb[c] * inv;
        dz[s->row_tgt[r]] -= 1.0f;
    }
    return loss;
}

/* Forward over the packed rows; returns the summed loss and leaves dlogits in s->dlog. */
static double model_forward(emg_session *s, int batch) {
    const int n = s->n_rows, d = s->d;
    encoder_forward(s);
    for (int l = 0; l < s->n_layers; l++) layer_forward(s, batch, l);
    transpose_op(s->opT, s->x, n, d);
    sme_gemm(&(emg_gemm){.M = n, .N = s->vocab, .K = d, .A = s->opT, .lda = n, .B = s->t_lm, .ldb = s->vocab,
                         .C = s->logits, .ldc = s->vocab_pad, .alpha = 1.0f});
    return crossentropy_forward_backward(s);
}

/* A weight gradient dW[i][j] = inv_n * sum_rows dy[row][i] x[row][j] (dy (N, rows_w), x (N, cols_w)) as
 * one GEMM of a batch-hoisted session; fp16 builds convert both operands into s->h_act at *cursor. */
static emg_gemm weight_gradient(emg_session *s, const float *dy, int rows_w, const float *x, int cols_w,
                                float *out, float inv_n, op_t **cursor) {
    const int n = s->n_rows;
#if EMG_SME_F16
    op_t *a = *cursor, *b = a + (long)n * rows_w;
    *cursor = b + (long)n * cols_w;
    to_f16(a, dy, (long)n * rows_w);
    to_f16(b, x, (long)n * cols_w);
#else
    const op_t *a = dy, *b = x;
    (void)cursor;
#endif
    return (emg_gemm){.M = rows_w, .N = cols_w, .K = n, .A = a, .lda = rows_w, .B = b, .ldb = cols_w, .C = out,
                      .ldc = cols_w, .alpha = inv_n};
}

/* Layer l's backward from s->dres (the residual stream's gradient after the layer; dres_t its k-major
 * operand) into s->din (before the layer), then the layer's weight gradients (and dWlm, for the top
 * layer) in one streaming session, contracting over every packed row at once. */
static void layer_backward(emg_session *s, int batch, int l, const op_t *dres_t) {
    const int n = s->n_rows, d = s->d, f = s->f;
    const float inv_n = 1.0f / (float)n;
    const struct layer_weights *w = &s->lw[l];
    const struct layer_acts *a = &s->la[l];

    /* the input-gradient chain: each GEMM also reads its result out transposed (vertical ZA slices), which
     * is the next GEMM's k-major operand; transposes remain only after Neon glue */
    sme_gemm(&(emg_gemm){.M = n, .N = f, .K = d, .A = dres_t, .lda = n, .B = w->w_f2, .ldb = f, .C = s->dpre,
                         .ldc = f, .alpha = 1.0f, .flags = GEMM_GATE, .gate = a->hid, .Ct = s->tB, .ldct = n,
                         .gate_t = a->hidT}); /* the ReLU backward in both readouts */
    sme_gemm(&(emg_gemm){.M = n, .N = d, .K = f, .A = as_kmajor(s, s->tB, (long)f * n), .lda = n, .B = w->w_f1,
                         .ldb = d, .C = s->dh2, .ldc = d, .alpha = 1.0f});
    rmsnorm_backward(s->dmid, s->dres, s->dh2, a->h2, a->r2, n, d, DOT_CHAINS);

    transpose_op(s->opT, s->dmid, n, d);
    sme_gemm(&(emg_gemm){.M = n, .N = d, .K = d, .A = s->opT, .lda = n, .B = w->w_wo, .ldb = d, .C = s->datt,
                         .ldc = d, .alpha = 1.0f, .Ct = s->dattT, .ldct = n});
    attention_backward(s, batch, a);
    sme_gemm(&(emg_gemm){.M = n, .N = d, .K = 3 * d, .A = as_kmajor(s, s->tA, 3L * d * n), .lda = n,
                         .B = w->w_qkv, .ldb = d, .C = s->din, .ldc = d, .alpha = 1.0f});
    rmsnorm_backward(s->din, s->dmid, s->din, a->h1, a->r1, n, d, DOT_CHAINS); /* din := d(loss)/d(layer input) */

    /* operand pairs (upstream gradient, layer input) */
    emg_gemm wg[5];
    int k = 0;
    op_t *cursor = NULL;
#if EMG_SME_F16
    cursor = s->h_act;
#endif
    if (l == s->n_layers - 1)
        wg[k++] = weight_gradient(s, s->dlog, s->vocab, s->x, d, s->g + s->o_lm, inv_n, &cursor);
    wg[k++] = weight_gradient(s, s->dres, d, a->hid, f, s->g + w->o_f2, inv_n, &cursor);
    wg[k++] = weight_gradient(s, s->dpre, f, a->h2, d, s->g + w->o_f1, inv_n, &cursor);
    wg[k++] = weight_gradient(s, s->dmid, d, a->att, d, s->g + w->o_wo, inv_n, &cursor);
    wg[k++] = weight_gradient(s, s->dqkv, 3 * d, a->h1, d, s->g + w->o_qkv, inv_n, &cursor);
    sme_gemm_many(wg, k);
}

/* Backward from s->dlog; writes the mean-loss gradient into s->g (every element). */
static void model_backward(emg_session *s, int batch) {
    const int n = s->n_rows, d = s->d;
    /* dres = dlogits Wlm, and dres^T (vertical readout) as the top layer's k-major operand */
    transpose_op(s->opT, s->dlog, n, s->vocab);
    sme_gemm(&(emg_gemm){.M = n, .N = d, .K = s->vocab, .A = s->opT, .lda = n, .B = s->w_lm, .ldb = d,
                         .C = s->dres, .ldc = d, .alpha = 1.0f, .Ct = s->tA, .ldct = n});
    const op_t *dres_t = as_kmajor(s, s->tA, (long)d * n);
    for (int l = s->n_layers - 1; l >= 0; l--) {
        if (l < s->n_layers - 1) { /* dres came out of Neon glue (a norm's backward): transpose it */
            transpose_op(s->opT, s->dres, n, d);
            dres_t = s->opT;
        }
        layer_backward(s, batch, l, dres_t);
        float *t = s->dres;
        s->dres = s->din, s->din = t;
    }
    rmsnorm_backward(s->dres, NULL, s->dres, s->x0, s->r0, n, d, DOT_CHAINS); /* d(loss)/d(embedding sum) */
    encoder_backward(s, s->dres, 1.0f / (float)n);
}

/* The shared AdamW (arm_adam.h) over every parameter, with the session's optimiser (the layer clipped). */
static void adam(emg_session *s, float lr) {
    adam_update(s->p, s->g, s->m, s->v, s->n_params, &s->core.opt, s->core.step, lr, ADAM_G2_SCALE_FIRST);
}

/* ---- the hooks of the shared session layer (emg_backend.h adds the exported ABI) ---------------- */

/* d_model from 64 in steps of 16 (the Neon dot product takes 16 floats a step; below 64 the SMSTART/SMSTOP
 * overhead outweighs the small tiles, and neon serves those widths) to the ABI's widest: every size is a
 * run-time GEMM dimension. Every head count, vocabulary, context and depth the ABI allows (the GEMMs take
 * any M, N, K, head_dim included, and mask their edges). */
static int supports(const emg_shape *shape) {
    return shape->d_model >= 64 && shape->d_model % 16 == 0;
}

static int init(emg_session *s) {
    if (emg_sme_cpu_status(EMG_SME_NEEDS_F16F16) != SME_CPU_OK) return EMG_ERR_UNSUPPORTED;
    const emg_core *c = &s->core;
    const emg_layout *lay = &c->layout;
    const int d = c->shape.d_model, f = 4 * d, heads = c->shape.n_heads, max_batch = c->max_batch;
    const int n_layers = c->shape.n_layers, vocab = c->shape.vocab, context = c->shape.context;
    const long rows = (long)max_batch * context;
    s->d = d, s->h = heads, s->hd = d / heads, s->f = f, s->n_layers = n_layers, s->max_rows = (int)rows;
    s->vocab = vocab, s->vocab_pad = (vocab + 3) & ~3, s->context = context, s->blk = (context + 3) & ~3;
    s->n_params = lay->n_params;
    s->p = c->params, s->m = c->adam_m, s->v = c->adam_v, s->g = c->grads;
    s->o_tok = lay->tok_emb, s->o_pos = lay->pos_emb, s->o_lm = lay->wlm;

    const size_t fl = sizeof(float), R = (size_t)rows;
    const size_t blocks = (size_t)max_batch * heads * s->blk * s->blk;
    for (int l = 0; l < n_layers; l++) {
        struct layer_weights *w = &s->lw[l];
        const long base = emg_layer_offset(lay, l);
        w->o_qkv = base + EMG_LAYER_WQ(d), w->o_wo = base + EMG_LAYER_WO(d);
        w->o_f1 = base + EMG_LAYER_WF1(d), w->o_f2 = base + EMG_LAYER_WF2(d);
        w->t_qkv = session_alloc(s, sizeof(op_t) * 3 * d * d);
        w->t_wo = session_alloc(s, sizeof(op_t) * d * d);
        w->t_f1 = session_alloc(s, sizeof(op_t) * 4 * d * d);
        w->t_f2 = session_alloc(s, sizeof(op_t) * 4 * d * d);
        struct layer_acts *a = &s->la[l];
        struct { float **ptr; size_t width; } acts[] = {
            {&a->h1, d}, {&a->r1, 1}, {&a->vT, d}, {&a->qk_pm, 2 * d}, {&a->att, d}, {&a->h2, d}, {&a->r2, 1},
            {&a->hid, f}, {&a->hidT, f}};
        for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) *acts[i].ptr = session_alloc(s, R * acts[i].width * fl);
        a->pt = session_alloc(s, fl * blocks);
    }
    s->t_lm = session_alloc(s, sizeof(op_t) * (size_t)vocab * d);
    s->seq_start = session_alloc(s, sizeof(int) * max_batch);
    s->seq_len = session_alloc(s, sizeof(int) * max_batch);
    s->row_tok = session_alloc(s, R);
    s->row_pos = session_alloc(s, R);
    s->row_tgt = session_alloc(s, R);
    struct { float **ptr; size_t width; } acts[] = {
        {&s->x0, d}, {&s->r0, 1}, {&s->x, d}, {&s->qk, 2 * d}, {&s->vals, d}, {&s->attT, d},
        {&s->logits, s->vocab_pad}, {&s->dlog, vocab}, {&s->dres, d}, {&s->din, d}, {&s->dpre, f},
        {&s->dh2, d}, {&s->dmid, d}, {&s->datt, d}, {&s->dattT, d}, {&s->dqkv, 3 * d}, {&s->tA, 3 * d},
        {&s->tB, f}};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) *acts[i].ptr = session_alloc(s, R * acts[i].width * fl);
    s->opT = session_alloc(s, sizeof(op_t) * R * (size_t)(vocab > f ? vocab : f));
    s->scores = session_alloc(s, fl * blocks);
    s->att_gemms = session_alloc(s, sizeof(emg_gemm) * 3 * max_batch * heads);
    s->p_blk = session_alloc(s, fl * blocks);
    s->ds_blk = session_alloc(s, fl * blocks);
#if EMG_SME_F16
    const long first = emg_layer_offset(lay, 0);
    s->h_w = session_alloc(s, sizeof(op_t) * (size_t)(s->n_params - first));
    /* widths of the five (gradient, input) pairs: (V+d) + (d+f) + (f+d) + (d+d) + (3d+d) */
    s->h_act = session_alloc(s, sizeof(op_t) * R * (vocab + 9 * d + 2 * f));
    const size_t op_sizes[OP_N] = {[OP_QK] = R * 2 * d, [OP_VALS] = R * d, [OP_PT] = blocks, [OP_ATTT] = R * d,
                                   [OP_VT] = R * d, [OP_DATTT] = R * d, [OP_DATT] = R * d, [OP_QKPM] = R * 2 * d,
                                   [OP_DST] = blocks, [OP_DS] = blocks, [OP_P] = blocks};
    for (int i = 0; i < OP_N; i++) s->h_ops[i] = session_alloc(s, sizeof(op_t) * op_sizes[i]);
    for (int l = 0; l < n_layers; l++) {
        struct layer_weights *w = &s->lw[l];
        w->w_qkv = s->h_w + (w->o_qkv - first), w->w_wo = s->h_w + (w->o_wo - first);
        w->w_f1 = s->h_w + (w->o_f1 - first), w->w_f2 = s->h_w + (w->o_f2 - first);
    }
    s->w_lm = s->h_w + (s->o_lm - first);
#else
    for (int l = 0; l < n_layers; l++) {
        struct layer_weights *w = &s->lw[l];
        w->w_qkv = s->p + w->o_qkv, w->w_wo = s->p + w->o_wo, w->w_f1 = s->p + w->o_f1, w->w_f2 = s->p + w->o_f2;
    }
    s->w_lm = s->p + s->o_lm;
#endif
    return s->alloc_failed ? EMG_ERR_NOMEM : EMG_OK;
}

static void release(emg_session *s) { session_free(s); }

static float loss_and_grad(emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths,
                           int want_grads) {
    pack_batch(s, batch, tokens, lengths);
    const float loss = (float)(model_forward(s, batch) / s->n_rows);
    if (want_grads) model_backward(s, batch);
    return loss;
}

/* Designated: the optional hooks (train_step, set_threads) stay NULL, and later hooks need no edit. */
const emg_backend emg_this_backend = {.supports = supports, .init = init, .release = release,
                                      .params_changed = refresh_weight_operands, .loss_and_grad = loss_and_grad,
                                      .adam = adam};

#define EMG_BACKEND_IMPLEMENTATION
#include "emg_backend.h"
