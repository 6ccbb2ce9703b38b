/* The width-generic parts of one training step, the private header of step.c and step_wide.c: always-inlined
 * functions that take the width D as their first argument. step.c calls them with a constant D from one
 * function per width 16..256 (EMG_DEFINE_STEP), so each width is compiled as its own specialisation (the GEMM
 * tile shapes depend on it); step_wide.c calls them once with D as a run-time value for the wider multiples of
 * 16 (EMG_STEP_WIDE: out-of-line GEMMs of run-time width). The heads, layers, vocabulary and context are read
 * from s->core.shape. Live positions of a chunk are packed into
 * consecutive rows and every operation runs over all rows of a block before the next starts, so each weight
 * matrix is streamed once per block.
 *
 * Forward per row (microgpt's loop):
 *   x[0] = rms(tok_emb[tok] + pos_emb[t])
 *   per layer l:  n1 = rms(x[l]);  qkv = n1 Wqkv^T;  o = attention(qkv);  x_mid = x[l] + o Wo^T
 *                 n2 = rms(x_mid);  hid = relu(n2 Wf1^T);  x[l + 1] = x_mid + hid Wf2^T
 *   logits = x[L] Wlm^T (no final norm);  loss = mean cross-entropy over the live rows. */

#ifndef EMG_X86_STEP_IMPL_H
#define EMG_X86_STEP_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "emg_backend.h"
#include "encoder.h"
#include "gemm.h"
#ifdef EMG_AMX
#include "gemm_amx.h"
#elif defined(EMG_BF16)
#include "gemm_bf16.h"
#endif
#include "norm.h"
#include "pool.h"
#include "session.h"
#include "step.h"
#include "threads.h"
#include "transpose.h"
#include "xent.h"

#define STEP_MAX_D EMG_MAX_D_MODEL /* the widest width a step runs (step_wide.c) */

#define NOT_INLINED static __attribute__((noinline, noclone))

/* Part of a pass: `rows` rows from the pass's row `row`, one block of one chunk. Its weight gradients go to
 * `grads` as `mode` says: written (the chunk's first block), continued (a later block: one chain of FMAs over
 * the chunk's rows), or folded (a one-block chunk whose participant also ran every chunk before it: its sum is
 * added to theirs in `grads`, the add emg_x86_reduce would do, without the chunk's own buffer or the pass over
 * it). Its embedding-table gradients, sums of scatter-adds, always go to the chunk's own buffer `own` (its
 * first block zeroes them). Its loss sum is added to *total. */
struct emg_segment {
    int row, rows;
    enum tn_mode mode;
    float *grads, *own;
    double *total;
};

/* What one participant runs at once over its activation rows: the sequences seq0..seq1-1, packed in `rows`
 * rows from row data_row, made of the blocks of one or more consecutive chunks. A pass may also be run by two
 * participants together (parts 2, only the run-time-width step: step.c, chunks_step): the same pass, in the
 * first participant's activations, each GEMM split by output columns (weight gradients: by rows) and the
 * row-wise work by segment, participant `tid` taking segment tid, with a barrier of `pool` between dependent
 * operations. `own`: the participant's activations, whose scratch (attention's, the bf16 operands) it uses. */
struct emg_pass {
    int seq0, seq1, data_row, rows, n_seg;
    struct emg_segment seg[4]; /* at most one block per chunk: EMG_X86_MAX_CHUNKS */
    int parts, tid;
    struct emg_pool *pool;
    struct emg_acts *own;
};
_Static_assert(EMG_X86_MAX_CHUNKS <= sizeof(((struct emg_pass *)0)->seg) / sizeof(struct emg_segment),
               "a pass holds a segment per chunk");

/* Attention of one sequence: step.c's per-width copies (EMG_DEFINE_STEP, which ignore D: it is their
 * constant) and step_wide.c's run-time-width one, called from pass_step. */
typedef void (*attention_forward_fn)(int D, int H, const float *qkv, float *o, float *att, int L, float *scratch);
typedef void (*attention_backward_fn)(int D, int H, const float *qkv, const float *att, const float *dout,
                                      float *dqkv, int L, float *scratch);

/* What is compiled per width: the forward and backward of one pass, and the rebuild of a participant's part
 * of the transposed weight copies (a pool function, emg_pool_fn). d_model 0: any width (step_wide.c). */
typedef void (*pass_step_fn)(struct emg_session *s, struct emg_acts *a, const struct emg_pass *pass,
                             const uint16_t *lengths, float inv_p);
struct emg_x86_kernel {
    int d_model;
    pass_step_fn pass_step;
    emg_pool_fn sync_part;
    int shares_pass; /* two participants can run one pass together (emg_pass.parts) */
};

/* step_wide.c's step: widths from STEP_WIDE_MIN (step.h), multiples of 16 up to EMG_MAX_D_MODEL. */
extern const struct emg_x86_kernel emg_x86_wide_kernel, emg_x86_wide_kernel_unshared;
#define SHARED_PASS_MIN 256 /* narrower widths take emg_x86_wide_kernel_unshared (step_wide.c says why) */

/* The GEMM calls name both operand forms: fp32 B (row-major, ldb) and B packed into bf16 pairs (pk, rows of ldb
 * pairs); the avx512_bf16 build (EMG_BF16) uses the packed form and the participant's bf16 scratch rows (bfa, bfb).
 * NN_ANY: an output width known only at run time (the padded vocabulary). */
#if defined(EMG_STEP_WIDE)
/* A run-time width: every GEMM is one out-of-line copy with run-time N and epilogue (panels of NC_MAX
 * vectors), instead of tiles inlined and shaped per call site. */
#ifdef EMG_BF16
/* Forward and input-gradient GEMMs read B's panels through copies in the participant's bfb (free outside the
 * weight gradients). amx_bf16 (EMG_AMX): tile products (gemm_amx.h) over the same packed operands, padded to
 * the tiles in bfa and bfb. */
NOT_INLINED void gemm_nn_wide(int rows, int N, int K, const float *A, int lda, const void *pk, int ldb, float *C,
                              int ldc, const float *E, int lde, int epi, uint16_t *bfa, uint16_t *bfb) {
#ifdef EMG_AMX
    gemm_nn_amx(rows, N, K, A, lda, (const uint32_t *)pk, ldb, C, ldc, E, lde, epi, bfa, (uint32_t *)bfb);
#else
    gemm_nn_bf16_panels(rows, N, K, A, lda, (const uint32_t *)pk, ldb, C, ldc, E, lde, epi, bfa, (uint32_t *)bfb);
#endif
}
NOT_INLINED void gemm_tn_wide(int M, int N, int P, const float *A, int lda, const float *B, int ldb, float *C,
                              int ldc, enum tn_mode mode, uint16_t *bfa, uint16_t *bfb) {
#ifdef EMG_AMX
    gemm_tn_amx(M, N, 1, P, A, B, 0, NULL, NULL, lda, ldb, C, ldc, tn_epi(mode), bfa, bfb);
#else
    gemm_tn_bf16_epi(M, N, P, A, lda, B, ldb, C, ldc, tn_epi(mode), bfa, bfb, 1);
#endif
}
#define NN(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi) \
    gemm_nn_wide(rows, N, K, A, lda, pk, ldb, C, ldc, E, lde, epi, bfa, v->bfb)
#define TN(M, N, P, A, lda, B, ldb, C, ldc, acc) gemm_tn_wide(M, N, P, A, lda, B, ldb, C, ldc, acc, bfa, bfb)
/* Two segments of a pass into the same gradient, the second folded in: C streamed once (as the fp32 build's
 * gemm_tn_fold2_wide below). */
NOT_INLINED void gemm_tn_fold2_wide(int M, int N, int P0, const float *A0, const float *B0, int P1, const float *A1,
                                    const float *B1, int lda, int ldb, float *C, int ldc, enum tn_mode mode0,
                                    uint16_t *bfa, uint16_t *bfb) {
#ifdef EMG_AMX /* every block of C takes both segments' tiles */
    gemm_tn_amx(M, N, 2, P0, A0, B0, P1, A1, B1, lda, ldb, C, ldc, tn_epi(mode0), bfa, bfb);
    return;
#endif
    const int m = M - M % FOLD2_MR; /* the rest: the two plain calls */
    gemm_tn_bf16_fold2_epi(m, N, P0, A0, B0, P1, A1, B1, lda, ldb, C, ldc, tn_epi(mode0), bfa, bfb);
    if (m == M) return;
    gemm_tn_wide(M - m, N, P0, A0 + m, lda, B0, ldb, C + (long)m * ldc, ldc, mode0, bfa, bfb);
    gemm_tn_wide(M - m, N, P1, A1 + m, lda, B1, ldb, C + (long)m * ldc, ldc, TN_FOLD, bfa, bfb);
}
#define TN_FOLD2(...) gemm_tn_fold2_wide(__VA_ARGS__, bfa, bfb)
#else
/* Reductions deeper than WIDE_K_BLOCK (gemm.h) run in blocks of at most that many steps, each over every row
 * and column before the next: a block's rows of A and its panels of B stay in L2 (at d384 the MLP's 1536-deep
 * A is 1.6 MB per 264 rows). Each block continues the sums the one before stored in C (a stored float is the
 * accumulator exactly), so every output is the same chain of FMAs; the epilogue acts once, at the last. A
 * block reads B through contiguous panel copies in `panel` (the participant's scratch, WIDE_PANEL_FLOATS). */
NOT_INLINED void gemm_nn_wide(int rows, int N, int K, const float *A, int lda, const float *B, int ldb, float *C,
                              int ldc, const float *E, int lde, int epi, float *panel) {
    /* EPI_FOLD (a sum from zero added to E at the end) is gemm_tn's; kept whole should it ever come here */
    const int nb = epi == EPI_FOLD ? 1 : (K + WIDE_K_BLOCK - 1) / WIDE_K_BLOCK, kb = round_up((K + nb - 1) / nb, VW);
    for (int k0 = 0; k0 < K; k0 += kb) {
        const int first = k0 == 0, last = k0 + kb >= K;
        int e = EPI_ADD; /* a middle block: continue from C */
        const float *eb = C;
        int ldeb = ldc;
        if (first && last) e = epi, eb = E, ldeb = lde;
        else if (first) e = epi == EPI_ADD ? EPI_ADD : EPI_NONE, eb = E, ldeb = lde;
        else if (last && epi == EPI_RELU) e = EPI_CONT_RELU;
        else if (last && epi == EPI_MASK) e = EPI_CONT_MASK, eb = E, ldeb = lde;
        const int kn = (last ? K : k0 + kb) - k0;
        if (kn <= WIDE_K_BLOCK)
            gemm_nn_any_panels(rows, N, kn, A + k0, lda, B + (long)k0 * ldb, ldb, C, ldc, eb, ldeb, e, panel);
        else /* a whole EPI_FOLD reduction deeper than the panel */
            gemm_nn_any(rows, N, kn, A + k0, lda, B + (long)k0 * ldb, ldb, C, ldc, eb, ldeb, e);
    }
}
/* Weight gradients: one segment, or two into the same gradient with the second folded in (one thread, a pass
 * holding two chunks; C streamed once), through gemm_tn_strips' copies in `scratch` (the participant's,
 * sized in session.c). mode0: the first segment's. */
NOT_INLINED void gemm_tn_fold2_wide(int M, int N, int P0, const float *A0, const float *B0, int P1, const float *A1,
                                    const float *B1, int lda, int ldb, float *C, int ldc, enum tn_mode mode0,
                                    float *scratch) {
    const long strips = (long)round_up(M, FOLD2_MR);
    struct tn_wide_segment seg[2] = {{P0, A0, B0, tn_epi(mode0), scratch, scratch + strips * (P0 + P1)},
                                     {P1, A1, B1, EPI_FOLD, scratch + strips * P0, 0}};
    seg[1].panel = seg[0].panel + (long)NC_MAX * VW * P0;
    gemm_tn_strips(M, N, A1 ? 2 : 1, seg, lda, ldb, C, ldc);
}
NOT_INLINED void gemm_tn_wide(int M, int N, int P, const float *A, int lda, const float *B, int ldb, float *C,
                              int ldc, enum tn_mode mode, float *scratch) {
    gemm_tn_fold2_wide(M, N, P, A, B, 0, NULL, NULL, lda, ldb, C, ldc, mode, scratch);
}
#define NN(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi) \
    gemm_nn_wide(rows, N, K, A, lda, B, ldb, C, ldc, E, lde, epi, v->scratch)
#define TN(M, N, P, A, lda, B, ldb, C, ldc, mode) gemm_tn_wide(M, N, P, A, lda, B, ldb, C, ldc, mode, v->scratch)
#define TN_FOLD2(...) gemm_tn_fold2_wide(__VA_ARGS__, v->scratch)
#endif
#define NN_ANY NN
#elif defined(EMG_BF16)
#define NN(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi) \
    gemm_nn_bf16(rows, N, K, A, lda, (const uint32_t *)(pk), ldb, C, ldc, E, lde, epi, bfa, 0)
#define NN_ANY(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi) \
    gemm_nn_bf16(rows, N, K, A, lda, (const uint32_t *)(pk), ldb, C, ldc, E, lde, epi, bfa, 1)
#define TN(M, N, P, A, lda, B, ldb, C, ldc, acc) gemm_tn_bf16(M, N, P, A, lda, B, ldb, C, ldc, acc, bfa, bfb)
#else
#define NN(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi) gemm_nn(rows, N, K, A, lda, B, ldb, C, ldc, E, lde, epi)
#define NN_ANY(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi) \
    gemm_nn_any(rows, N, K, A, lda, B, ldb, C, ldc, E, lde, epi)
#define TN gemm_tn
#endif

/* TN_FOLD2: the fused two-segment weight gradient, where a build has one (the run-time-width step, fp32 and
 * bf16: its gradients outgrow the caches; at the compiled widths a gradient stays in L2 and the second pass
 * over it is cheap). */
#ifdef TN_FOLD2
#define HAVE_TN_FOLD2 1
#else
#define HAVE_TN_FOLD2 0
#define TN_FOLD2(...) ((void)0)
#endif

/* A pass run by two participants together (emg_pass.parts): built only where TN_FOLD2 is, since the pass's
 * weight gradients are the two-segment fold, split by rows. Two threads at batch 16 otherwise run one chunk
 * each, over the whole of every weight matrix: at d1024 each core streams every weight (and writes a whole
 * gradient of its own, for emg_x86_reduce to add) for half the rows, and perf put the forward and
 * input-gradient GEMMs at about 1.4 times one thread's core time. Split by columns, each participant streams
 * half of each matrix for all rows, as one thread would (backends/x86/README.md, "Two threads at wide widths"). */
AI int pass_shared(const struct emg_pass *pass) { return HAVE_TN_FOLD2 && pass->parts > 1; }

/* Between two operations of a shared pass where the second reads what both participants wrote in the first. */
AI void part_sync(const struct emg_pass *pass) {
    if (pass_shared(pass)) emg_pool_barrier(pass->pool);
}

/* [*c0, *c1): the participant's columns of an N-wide output (or rows of an N-row weight gradient): halves
 * split at a multiple of 16, so the bf16 operands' packing (columns rounded up to 16) stays inside the rows. */
AI void part_cols(const struct emg_pass *pass, int N, int *c0, int *c1) {
    *c0 = 0;
    *c1 = N;
    if (!pass_shared(pass)) return;
    const int mid = (N / 2 + 8) / 16 * 16;
    *(pass->tid == 0 ? c1 : c0) = mid;
}

AI const float *cols_at(const float *p, int c) { return p ? p + c : p; }

/* NN or NN_ANY (gemm) over the participant's columns of the output (all of them unless the pass is shared). */
#define PART_GEMM(gemm, rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi)                                    \
    do {                                                                                                       \
        if (!pass_shared(pass)) {                                                                              \
            gemm(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi);                                         \
            break;                                                                                             \
        }                                                                                                      \
        int c0_, c1_;                                                                                          \
        part_cols(pass, N, &c0_, &c1_);                                                                        \
        if (c1_ > c0_)                                                                                         \
            gemm(rows, c1_ - c0_, K, A, lda, (B) + c0_, ldb, (pk) + c0_, (C) + c0_, ldc, cols_at(E, c0_), lde, \
                 epi);                                                                                         \
    } while (0)
#define PART_NN(...) PART_GEMM(NN, __VA_ARGS__)
#define PART_NN_ANY(...) PART_GEMM(NN_ANY, __VA_ARGS__)

/* For y = x W^T with W [N][K] (rows a multiple of ROW_PAD):
 * matmul_forward: out[rows][N] = epi(inp[rows][K] W^T) from the forward copy W^T (w_t) or its bf16 pairs (pk_t),
 *   starting from the residual E for EPI_ADD;
 * matmul_backward: dinp[rows][K] = dout W (masked by the ReLU output E for EPI_MASK) and, per segment of the
 *   pass (the rows of one chunk), dW (+)= dout^T inp over its rows into that chunk's gradient at offset g_off
 *   (added when the segment continues its chunk). In a shared pass each participant computes its columns of
 *   out and dinp and its rows of dW. */
#define matmul_forward(rows, N, K, out, inp, w_t, pk_t, E, epi) \
    PART_NN(rows, N, K, inp, K, w_t, N, pk_t, out, N, E, N, epi)
#define matmul_backward(n_rows, N, K, dinp, g_off, dout, ld_dout, inp, w, pk, E, epi)                          \
    do {                                                                                                     \
        PART_NN(n_rows, K, N, dout, ld_dout, w, K, pk, dinp, K, E, K, epi);                                 \
        const struct emg_segment *s0_ = &pass->seg[0], *s1_ = &pass->seg[1];                               \
        if (HAVE_TN_FOLD2 && pass->n_seg == 2 && s1_->mode == TN_FOLD && s0_->grads == s1_->grads) {       \
            int m0_, m1_; /* a shared pass: the participant's rows of the gradient */                        \
            part_cols(pass, N, &m0_, &m1_);                                                                  \
            if (m1_ > m0_)                                                                                   \
                TN_FOLD2(m1_ - m0_, K, s0_->rows, (dout) + (long)s0_->row * (ld_dout) + m0_,                 \
                         (inp) + (long)s0_->row * (K), s1_->rows, (dout) + (long)s1_->row * (ld_dout) + m0_, \
                         (inp) + (long)s1_->row * (K), ld_dout, K, s0_->grads + (g_off) + (long)m0_ * (K), K, \
                         s0_->mode);                                                                         \
            break;                                                                                           \
        }                                                                                                    \
        for (int q_ = 0; q_ < pass->n_seg; q_++) {                                                          \
            const struct emg_segment *sg_ = &pass->seg[q_];                                                 \
            TN(N, K, sg_->rows, (dout) + (long)sg_->row * (ld_dout), ld_dout, (inp) + (long)sg_->row * (K), K, \
               sg_->grads + (g_off), K, sg_->mode);                                                         \
        }                                                                                                    \
    } while (0)

/* Layer l's slice of a per-layer copy (fp32 transposed, or bf16 pairs) of `size` floats per layer. */
#define LAYER_COPY(field, l, size) (s->field + (long)(l) * (size))

/* Participant tid of n rebuilds the rows of each transposed copy (avx512_bf16: each packed copy, the forward
 * ones straight from the weights) whose weights its own Adam share updated (threads.h emg_x86_share_rows): it
 * reads only weights in its own cache. Packing every n-th block instead read the other core's freshly written
 * weights, and that core's next Adam stores then waited for the lines to come back: at d128 batch 16 on two
 * threads (Zen 4) the update took 4.6 times as long per parameter as on one. */
AI void sync_part(const int D, struct emg_session *s, int tid, int n) {
    const int F = 4 * D;
    const float *p = s->core.params, *wlm = p + s->core.layout.wlm;
    const int V = s->core.shape.vocab, VP = s->logit_ld;
#define OWN_ROWS(w, rows, cols, tile) /* [lo_, hi_): rows of w whose weights tid's Adam share updated */ \
    int lo_, hi_;                                                                                          \
    emg_x86_share_rows(s->core.layout.n_params, (w) - p, rows, cols, tile, tid, n, &lo_, &hi_)
#ifdef EMG_BF16
/* Both packed copies of W[rows][cols], of the rows tid's Adam share updated (in tiles of 16 rows): W^T's pairs
 * (Nt outputs: rows padded with zero rows) and W's own rows in pairs (padded with zero rows to Kp: the owner of
 * W's last row packs the padding). Sixteen rows of W at a time, so the second pack reads rows the first has
 * just brought into cache; one whole pass after the other streamed a 4-16 MB matrix from memory twice at the
 * run-time widths. */
#define PACK_BOTH_OWN(w, rows, cols, Nt, Kp, dst_t, dst)                                                    \
    do {                                                                                                   \
        OWN_ROWS(w, rows, cols, 16);                                                                       \
        for (int r0_ = lo_; r0_ < hi_; r0_ += 16) {                                                        \
            const int r1_ = r0_ + 16 < hi_ ? r0_ + 16 : hi_;                                               \
            pack_pairs_t(w, rows, cols, cols, Nt, (uint32_t *)(dst_t), r0_, r1_);                          \
            pack_pairs(w, cols, rows, cols, (uint32_t *)(dst), r0_ / 2, (r1_ == (rows) ? (Kp) : r1_) / 2); \
        }                                                                                                  \
    } while (0)
#else
#define TRANSPOSE_OWN(w, rows, cols, dst, ld_dst)                                                          \
    do {                                                                                                   \
        OWN_ROWS(w, rows, cols, TILE);                                                                     \
        transpose_rows(w, rows, cols, cols, dst, ld_dst, lo_, hi_);                                        \
    } while (0)
#endif
    for (int l = 0; l < s->core.shape.n_layers; l++) {
        const float *w = p + emg_layer_offset(&s->core.layout, l);
        const float *wqkv = w + EMG_LAYER_WQ(D), *wo = w + EMG_LAYER_WO(D), *wf1 = w + EMG_LAYER_WF1(D);
        const float *wf2 = w + EMG_LAYER_WF2(D);
#ifdef EMG_BF16
        PACK_BOTH_OWN(wqkv, 3 * D, D, 3 * D, 3 * D, LAYER_COPY(pk_qkv_t, l, 3 * D * D / 2),
                      LAYER_COPY(pk_qkv, l, 3 * D * D / 2));
        PACK_BOTH_OWN(wo, D, D, D, D, LAYER_COPY(pk_o_t, l, D * D / 2), LAYER_COPY(pk_o, l, D * D / 2));
        PACK_BOTH_OWN(wf1, F, D, F, F, LAYER_COPY(pk_f1_t, l, 2 * D * D), LAYER_COPY(pk_f1, l, 2 * D * D));
        PACK_BOTH_OWN(wf2, D, F, D, D, LAYER_COPY(pk_f2_t, l, 2 * D * D), LAYER_COPY(pk_f2, l, 2 * D * D));
#else
        TRANSPOSE_OWN(wqkv, 3 * D, D, LAYER_COPY(wqkv_t, l, 3 * D * D), 3 * D);
        TRANSPOSE_OWN(wo, D, D, LAYER_COPY(wo_t, l, D * D), D);
        TRANSPOSE_OWN(wf1, F, D, LAYER_COPY(wf1_t, l, 4 * D * D), F);
        TRANSPOSE_OWN(wf2, D, F, LAYER_COPY(wf2_t, l, 4 * D * D), D);
#endif
    }
#ifdef EMG_BF16
    PACK_BOTH_OWN(wlm, V, D, VP, VP, s->pk_lm_t, s->pk_lm); /* W^T's columns and W's rows V..VP-1: zero */
#undef PACK_BOTH_OWN
#else
    (void)VP;
    TRANSPOSE_OWN(wlm, V, D, s->wlm_t, s->logit_ld); /* columns V..VP-1 stay zero */
#undef TRANSPOSE_OWN
#endif
#undef OWN_ROWS
}

/* Attention for one sequence of L rows. The head count is a compile-time constant for 4 and 8 heads (the
 * presets' counts: every loop over heads and head features unrolls, the softmax state stays in registers),
 * and so is the lane count for sequences of one query block (L <= VW: every name at the default context with
 * AVX-512); any other head count runs attention_forward_any / attention_backward_any (above). Measured at
 * d16 / d32, batch 16: a run-time head count costs 13% / 6% of the step, a run-time lane count 4% / 2%. */
#define ATTENTION_SEQ(call, H, L, ...)                                 \
    do {                                                                \
        if ((H) == 4 && (L) <= VW)                                      \
            call(D, 4, __VA_ARGS__, L, VW, scratch);                    \
        else if ((H) == 4)                                              \
            call(D, 4, __VA_ARGS__, L, att_lanes(L), scratch);          \
        else if (D / 8 >= 4 && (H) == 8 && (L) <= VW)                   \
            call(D, 8, __VA_ARGS__, L, VW, scratch);                    \
        else if (D / 8 >= 4 && (H) == 8)                                \
            call(D, 8, __VA_ARGS__, L, att_lanes(L), scratch);          \
        else                                                            \
            call##_any(D, H, __VA_ARGS__, L, scratch);                  \
    } while (0)

/* Attention with the width and head count as run-time values: one copy for every head count that the
 * functions below do not compile as a constant. */
NOT_INLINED void attention_forward_any(int D, int H, const float *qkv, float *o, float *att, int L, float *scratch) {
    attention_forward(D, H, qkv, o, att, L, att_lanes(L), scratch);
}

NOT_INLINED void attention_backward_any(int D, int H, const float *qkv, const float *att, const float *dout,
                                        float *dqkv, int L, float *scratch) {
    attention_backward(D, H, qkv, att, dout, dqkv, L, att_lanes(L), scratch);
}

AI void attention_forward_seq(const int D, int H, const float *qkv, float *o, float *att, int L, float *scratch) {
    ATTENTION_SEQ(attention_forward, H, L, qkv, o, att);
}

AI void attention_backward_seq(const int D, int H, const float *qkv, const float *att, const float *dout,
                               float *dqkv, int L, float *scratch) {
    ATTENTION_SEQ(attention_backward, H, L, qkv, att, dout, dqkv);
}
#undef ATTENTION_SEQ

/* What every part of one pass reads of the session, the participant's activations and the pass (built once
 * per part; every user is inlined, so its fields stay in registers). */
struct pass_view {
    const emg_layout *lay;
    const float *params;
    int NL, H, V, VP;
    int P, Pp, R; /* the pass's live rows, padded to ROW_PAD; the activation buffers' rows */
    int r0, r1;   /* the participant's rows for row-wise work: [0, Pp), or its segment's in a shared pass */
    long att_layer; /* floats of one layer's attention probabilities */
    const int *row_tok, *row_tgt, *row_pos; /* the pass's rows of the row bookkeeping */
    float *scratch; /* the participant's own: attention's, and the bf16 operands (bfa, bfb) */
#ifdef EMG_BF16
    uint16_t *bfa, *bfb;
#endif
};

AI struct pass_view pass_view(const struct emg_session *s, const struct emg_acts *a, const struct emg_pass *pass) {
    const int H = s->core.shape.n_heads, P = pass->rows, Pp = round_up(P, ROW_PAD), data_row = pass->data_row;
    /* a shared pass: participant 1 takes segment 1's rows and the padding */
    const int split = pass_shared(pass) ? pass->seg[1].row : 0;
    const struct emg_rows rows = emg_x86_rows(s);
    return (struct pass_view){.lay = &s->core.layout, .params = s->core.params, .NL = s->core.shape.n_layers, .H = H,
                              .V = s->core.shape.vocab, .VP = s->logit_ld, .P = P, .Pp = Pp, .R = a->rows,
                              .r0 = pass_shared(pass) && pass->tid == 1 ? split : 0,
                              .r1 = pass_shared(pass) && pass->tid == 0 ? split : Pp,
                              .att_layer = (long)a->rows * H * s->att_lanes, .row_tok = rows.tok + data_row,
                              .row_tgt = rows.tgt + data_row, .row_pos = rows.pos + data_row,
                              .scratch = pass->own->scratch,
#ifdef EMG_BF16
                              .bfa = (uint16_t *)pass->own->bf_a, .bfb = (uint16_t *)pass->own->bf_b
#endif
    };
}

#define ACT(field, l, width) (a->field + (long)(l) * v->R * (width)) /* layer l's rows of a per-layer activation */
#define LAYER_W(l, tensor) (v->params + emg_layer_offset(v->lay, l) + EMG_LAYER_##tensor(D))
#define LAYER_G(l, tensor) (emg_layer_offset(v->lay, l) + EMG_LAYER_##tensor(D)) /* offset into a gradient */

/* Layer l forward over the pass's rows: x[l + 1] from x[l], keeping what layer_backward reads. r1 holds the
 * mean squares of x[l] for l = 0 (chained from the embedding norm, model_forward). */
AI void layer_forward(const int D, attention_forward_fn attention_forward_w, struct emg_session *s,
                      struct emg_acts *a, const struct emg_pass *pass, const struct pass_view *v,
                      const uint16_t *lengths, int l) {
    const int F = 4 * D, H = v->H, P = v->P, Pp = v->Pp, r0 = v->r0, r_end = v->r1;
#ifdef EMG_BF16
    uint16_t *bfa = v->bfa;
#endif
    float *x = ACT(x, l, D), *n1 = ACT(n1, l, D), *r1 = ACT(r1, l, 1), *qkv = ACT(qkv, l, 3 * D);
    float *att = a->att + l * v->att_layer, *o = ACT(o, l, D), *x_mid = ACT(x_mid, l, D), *n2 = ACT(n2, l, D);
    float *r2 = ACT(r2, l, 1), *hid = ACT(hid, l, F);
    if (l > 0)
        for (int p = r0; p < r_end; p++) r1[p] = rmsnorm_mean_sq(D, x + p * D);
    rmsnorm_scales(r1 + r0, r_end - r0);
    for (int p = r0; p < r_end; p++) (void)rmsnorm_apply(D, x + p * D, r1[p], n1 + p * D);
    part_sync(pass);
    matmul_forward(Pp, 3 * D, D, qkv, n1, LAYER_COPY(wqkv_t, l, 3 * D * D), LAYER_COPY(pk_qkv_t, l, 3 * D * D / 2),
                   NULL, EPI_NONE);
    part_sync(pass);
    if (r_end == Pp) memset(o + P * D, 0, sizeof(float) * (size_t)(Pp - P) * D);
    long att_off = 0;
    for (int b = pass->seq0, r = 0; b < pass->seq1; b++) {
        const int L = lengths[b] - 1;
        if (r >= r0 && r < r_end) /* the participant's sequences */
            attention_forward_w(D, H, qkv + r * 3 * D, o + r * D, att + att_off, L, v->scratch);
        r += L;
        att_off += (long)H * L * att_lanes(L);
    }
    part_sync(pass);
    matmul_forward(Pp, D, D, x_mid, o, LAYER_COPY(wo_t, l, D * D), LAYER_COPY(pk_o_t, l, D * D / 2), x, EPI_ADD);
    part_sync(pass);
    rmsnorm_forward(D, x_mid + r0 * D, r_end - r0, r2 + r0, n2 + r0 * D);
    part_sync(pass);
    matmul_forward(Pp, F, D, hid, n2, LAYER_COPY(wf1_t, l, 4 * D * D), LAYER_COPY(pk_f1_t, l, 2 * D * D), NULL,
                   EPI_RELU);
    part_sync(pass);
    matmul_forward(Pp, D, F, ACT(x, l + 1, D), hid, LAYER_COPY(wf2_t, l, 4 * D * D),
                   LAYER_COPY(pk_f2_t, l, 2 * D * D), x_mid, EPI_ADD);
    part_sync(pass);
}

/* Forward of one pass: the sequences pass->seq0..seq1-1, whose pass->rows live rows are packed from row
 * pass->data_row of the row bookkeeping; their activations are the first rows of the participant's `a`. Ends
 * with the loss: each segment's loss sum goes to its chunk's total and the logits rows become dloss/dlogits. */
AI void model_forward(const int D, attention_forward_fn attention_forward_w, struct emg_session *s,
                      struct emg_acts *a, const struct emg_pass *pass, const struct pass_view *v,
                      const uint16_t *lengths, float inv_p) {
    const int NL = v->NL, V = v->V, VP = v->VP, P = v->P, Pp = v->Pp, r0 = v->r0, r_end = v->r1;
    const float *params = v->params;
#ifdef EMG_BF16
    uint16_t *bfa = v->bfa;
#endif

    /* The embedding and its norm, chained with layer 0's first norm: rmsnorm_apply returns the mean squares
     * of what it writes. Padding rows are zero all the way through the step. */
    float *x0 = a->x;
    encoder_forward(D, params + v->lay->tok_emb, params + v->lay->pos_emb, v->row_tok + r0, v->row_pos + r0,
                    (P < r_end ? P : r_end) - r0, r_end - r0, x0 + r0 * D, a->r_emb + r0);
    rmsnorm_scales(a->r_emb + r0, r_end - r0);
    for (int p = r0; p < r_end; p++) a->r1[p] = rmsnorm_apply(D, x0 + p * D, a->r_emb[p], x0 + p * D);
    for (int l = 0; l < NL; l++) layer_forward(D, attention_forward_w, s, a, pass, v, lengths, l);
    const float *x_last = ACT(x, NL, D);
    float *logits = a->logits;
    PART_NN_ANY(Pp, VP, D, x_last, D, s->wlm_t, VP, s->pk_lm_t, logits, VP, NULL, 0, EPI_NONE);
    part_sync(pass);

    /* Cross-entropy per segment (its loss sum goes to its chunk's total); the logits rows become
     * dloss/dlogits = (softmax - onehot) / P_total in place. */
    for (int q = 0; q < pass->n_seg; q++) {
        if (pass_shared(pass) && q != pass->tid) continue;
        const struct emg_segment *sg = &pass->seg[q];
        *sg->total += crossentropy_forward_backward(logits + (long)sg->row * VP, VP, V, v->row_tgt + sg->row,
                                                    sg->rows, inv_p);
    }
}

/* Layer l backward: a->dx holds dloss/dx[l + 1]; into the segments' weight gradients, and (l > 0) dloss/dx[l]
 * into a->dx; for l = 0 a->dn1 and a->dx_mid are left for model_backward's first norm. */
AI void layer_backward(const int D, attention_backward_fn attention_backward_w, struct emg_session *s,
                       struct emg_acts *a, const struct emg_pass *pass, const struct pass_view *v,
                       const uint16_t *lengths, int l) {
    const int F = 4 * D, H = v->H, P = v->P, Pp = v->Pp, r0 = v->r0, r_end = v->r1;
#ifdef EMG_BF16
    uint16_t *bfa = v->bfa, *bfb = v->bfb;
#endif
    (void)s; /* the bf16 build's packed weights only */
    float *dx = a->dx, *dhid = a->dhid, *dn2 = a->dn2, *dx_mid = a->dx_mid, *dout = a->dout, *dqkv = a->dqkv;
    float *dn1 = a->dn1;
    const float *n1 = ACT(n1, l, D), *r1 = ACT(r1, l, 1), *qkv = ACT(qkv, l, 3 * D), *att = a->att + l * v->att_layer;
    const float *o = ACT(o, l, D), *n2 = ACT(n2, l, D), *r2 = ACT(r2, l, 1), *hid = ACT(hid, l, F);
    /* MLP: x[l + 1] = x_mid + relu(n2 Wf1^T) Wf2^T; dx holds dloss/dx[l + 1] */
    matmul_backward(Pp, D, F, dhid, LAYER_G(l, WF2), dx, D, hid, LAYER_W(l, WF2), LAYER_COPY(pk_f2, l, 2 * D * D),
                    hid, EPI_MASK);
    part_sync(pass);
    matmul_backward(Pp, F, D, dn2, LAYER_G(l, WF1), dhid, F, n2, LAYER_W(l, WF1), LAYER_COPY(pk_f1, l, 2 * D * D),
                    NULL, EPI_NONE);
    part_sync(pass);
    for (int p = r0; p < r_end; p++) rmsnorm_backward(D, dn2 + p * D, n2 + p * D, r2[p], dx + p * D, dx_mid + p * D);
    part_sync(pass);
    /* attention: x_mid = x[l] + attention(n1 Wqkv^T) Wo^T */
    matmul_backward(Pp, D, D, dout, LAYER_G(l, WO), dx_mid, D, o, LAYER_W(l, WO), LAYER_COPY(pk_o, l, D * D / 2),
                    NULL, EPI_NONE);
    part_sync(pass);
    if (r_end == Pp) memset(dqkv + P * 3 * D, 0, sizeof(float) * (size_t)(Pp - P) * 3 * D);
    long att_off = 0;
    for (int b = pass->seq0, r = 0; b < pass->seq1; b++) {
        const int L = lengths[b] - 1;
        if (r >= r0 && r < r_end) /* the participant's sequences */
            attention_backward_w(D, H, qkv + r * 3 * D, att + att_off, dout + r * D, dqkv + r * 3 * D, L,
                                 v->scratch);
        r += L;
        att_off += (long)H * L * att_lanes(L);
    }
    part_sync(pass);
    /* Q, K, V projections (one GEMM each way: Wq, Wk, Wv are adjacent in the parameter layout) */
    matmul_backward(Pp, 3 * D, D, dn1, LAYER_G(l, WQ), dqkv, 3 * D, n1, LAYER_W(l, WQ),
                    LAYER_COPY(pk_qkv, l, 3 * D * D / 2), NULL, EPI_NONE);
    part_sync(pass);
    if (l > 0) { /* dloss/dx[l], the next layer down's dloss/dx[l + 1] */
        for (int p = r0; p < r_end; p++)
            rmsnorm_backward(D, dn1 + p * D, n1 + p * D, r1[p], dx_mid + p * D, dx + p * D);
        part_sync(pass);
    }
}

/* Backward of one pass after model_forward, into the segments' gradients: the LM head, the layers in reverse,
 * the first norm, the embedding norm and the embedding scatter. */
AI void model_backward(const int D, attention_backward_fn attention_backward_w, struct emg_session *s,
                       struct emg_acts *a, const struct emg_pass *pass, const struct pass_view *v,
                       const uint16_t *lengths) {
    const emg_layout *lay = v->lay;
    const int NL = v->NL, V = v->V, VP = v->VP, P = v->P, Pp = v->Pp;
    const float *params = v->params;
#ifdef EMG_BF16
    uint16_t *bfa = v->bfa, *bfb = v->bfb;
#endif
    (void)params; /* the fp32 build's row-major Wlm only */
    float *x0 = a->x, *logits = a->logits, *dx = a->dx, *dx_mid = a->dx_mid, *dn1 = a->dn1;
    const float *x_last = ACT(x, NL, D);
    if (v->r1 == Pp) memset(logits + P * VP, 0, sizeof(float) * (size_t)(Pp - P) * VP);
    part_sync(pass);

    /* LM head: logits = x[L] Wlm^T, Wlm [V][D] */
    matmul_backward(Pp, V, D, dx, lay->wlm, logits, VP, x_last, params + lay->wlm, s->pk_lm, NULL, EPI_NONE);
    part_sync(pass);
    for (int l = NL - 1; l >= 0; l--) layer_backward(D, attention_backward_w, s, a, pass, v, lengths, l);
    /* Layer 0's first norm, the embedding norm and the embedding scatter, row by row into each row's chunk. */
    for (int q = 0; q < pass->n_seg; q++) {
        if (pass_shared(pass) && q != pass->tid) continue;
        const struct emg_segment *sg = &pass->seg[q];
        float *g_tok = sg->own + lay->tok_emb, *g_pos = sg->own + lay->pos_emb;
        if (sg->mode != TN_CONTINUE) /* the chunk's first block: both tables start from zero */
            memset(g_tok, 0, sizeof(float) * (size_t)(lay->layers - lay->tok_emb));
        for (int p = sg->row; p < sg->row + sg->rows; p++) {
            float dx0[STEP_MAX_D], de[STEP_MAX_D];
            rmsnorm_backward(D, dn1 + p * D, a->n1 + p * D, a->r1[p], dx_mid + p * D, dx0);
            rmsnorm_backward(D, dx0, x0 + p * D, a->r_emb[p], NULL, de);
            encoder_backward(D, de, g_tok + v->row_tok[p] * D, g_pos + v->row_pos[p] * D);
        }
    }
}
#undef ACT
#undef LAYER_W
#undef LAYER_G

/* Forward (and backward into the segments' gradients when they are not NULL) of one pass. Every row-wise
 * operation runs over the whole pass; the sums over rows (weight gradients, loss, embedding scatter) run per
 * segment, as its chunk alone would, so merging the blocks of several chunks into one pass changes no bit.
 * attention_forward_w and attention_backward_w: the width's attention_forward_seq and attention_backward_seq. */
AI void pass_step(const int D, attention_forward_fn attention_forward_w, attention_backward_fn attention_backward_w,
                  struct emg_session *s, struct emg_acts *a, const struct emg_pass *pass, const uint16_t *lengths,
                  float inv_p) {
    const struct pass_view v = pass_view(s, a, pass);
    model_forward(D, attention_forward_w, s, a, pass, &v, lengths, inv_p);
    if (pass->seg[0].grads == NULL) return;
    model_backward(D, attention_backward_w, s, a, pass, &v, lengths);
}

#undef NN
#undef NN_ANY
#undef TN
#undef LAYER_COPY
#undef matmul_forward
#undef matmul_backward
#undef PART_GEMM
#undef PART_NN
#undef PART_NN_ANY

#endif /* EMG_X86_STEP_IMPL_H */
