/* The session object: owned by session.c (the backend hooks: init and release lay out its buffers), read by
 * the step (step.c) and the thread split (threads.c), which keep their own state behind the pointers `k` and
 * `split` (step.h, threads.h). Sizes in the buffer comments: L = n_layers, D = d_model, H = n_heads, V = vocab,
 * VP = logit_ld, R = a participant's block rows (acts.rows), A = att_lanes. */
#ifndef EMG_X86_SESSION_H
#define EMG_X86_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "emg_backend.h"

struct emg_split;      /* threads.c's */
struct emg_x86_kernel; /* step.c's */

/* Live rows per block of a chunk (step.c, chunks_step): about two batches of 16 names. Measured per
 * sample at batch 256 against batch 64 (d64 / d128, one layer): unblocked 15% / 3% slower; blocks of 480 rows
 * 2% slower / 2% faster; 240 rows 2% / 2% faster; 120 rows about even. A multiple of ROW_PAD (gemm.h). */
#define BLOCK_ROWS 240
/* A block never splits a sequence: a context longer than BLOCK_ROWS (241..EMG_MAX_CONTEXT) gets blocks of one
 * whole sequence (emg_session.block_rows), so shorter contexts keep the measured BLOCK_ROWS. */
/* Widths of the run-time-width step (STEP_WIDE_MIN and up) stream their weights (7 MB a layer at d384) from memory
 * once per pass and their gradients in and out: blocks of up to WIDE_BLOCK_ROWS rows, as far as one
 * participant's activations stay within about WIDE_BLOCK_BYTES, spread that over more rows: 1.06x at nanoGPT's
 * full shape, 1.13x at d1024 context 16 on avx512 (backends/x86/README.md, "Wide blocks"). d1024 at 12 layers
 * and context 256 (790 KB of activations a row) keeps one sequence a block. */
#define WIDE_BLOCK_ROWS 960
#define WIDE_BLOCK_BYTES (160L << 20)

/* One participant's working memory for one block of packed rows: the activations of every layer (so the
 * backward pass runs the layers in reverse), the backward buffers every layer reuses, and attention's
 * scratch. Padding rows (a block's rows up to a multiple of ROW_PAD) are zero all the way through. */
struct emg_acts {
    int rows;       /* R: min(block_rows, the session's largest batch of live rows), a multiple of ROW_PAD */
    float *x;       // (L + 1, R, D)  residual stream: x[0] = rms(tok_emb + pos_emb), x[l + 1] = layer l's output
    float *r_emb;   // (R)            1 / rms of the embedding sum
    float *n1;      // (L, R, D)      rms(x[l]): attention's input
    float *r1;      // (L, R)         its 1 / rms
    float *qkv;     // (L, R, 3D)     q, k, v
    float *att;     // (L, R * H * A) per sequence of n rows: P^T (H, n, att_lanes(n)) (attention.h)
    float *o;       // (L, R, D)      attention output, before Wo
    float *x_mid;   // (L, R, D)      x[l] + Wo o
    float *n2;      // (L, R, D)      rms(x_mid): the MLP's input
    float *r2;      // (L, R)
    float *hid;     // (L, R, 4D)     relu(Wf1 n2)
    float *logits;  // (R, VP)        Wlm x[L]; then dloss/dlogits in place
    float *dx;      // (R, D)         dloss/dx[l + 1], then dloss/dx[l]
    float *dhid;    // (R, 4D)
    float *dn2;     // (R, D)
    float *dx_mid;  // (R, D)
    float *dout;    // (R, D)         dloss/do
    float *dqkv;    // (R, 3D)
    float *dn1;     // (R, D)
    float *scratch; // attention_scratch(D, H, A): one sequence's lane rows; fp32: also the wide GEMMs' copies
#ifdef EMG_BF16
    /* bf16 GEMM operands, rounded just before use (gemm_bf16.h) */
    float *bf_a;    // (R, max(4D, VP)) bf16
    float *bf_b;    // (R, 4D) bf16; at least max(4D, VP) / 2 x 64 pairs (gemm_nn_bf16_panels)
#endif
    void *arena;    /* one allocation holding all of the above */
};

/* Allocate (zeroed) and free one participant's emg_acts for the session's shape. */
int emg_x86_acts_alloc(const struct emg_session *s, struct emg_acts *a);
void emg_x86_acts_free(struct emg_acts *a);

struct emg_session {
    emg_core core; /* shape, layout, step and the training state: owned by the shared layer */
    const struct emg_x86_kernel *k; /* the step compiled for this width */
    int logit_ld;  /* VP = round_up(vocab, 16): logit rows, the LM head's padded output width */
    int att_lanes; /* A = att_lanes(context): the widest attention lane row */
    int max_rows;  /* live rows of a full batch (the chunks are packed one after another) */
    int block_rows; /* live rows per block: max(BLOCK_ROWS, context rounded up to ROW_PAD), more when wide */
#ifndef EMG_BF16
    /* Transposed weight copies for the forward GEMMs, [in][out]: */
    float *wqkv_t; // (L, D, 3D)
    float *wo_t;   // (L, D, D)
    float *wf1_t;  // (L, D, 4D)
    float *wf2_t;  // (L, 4D, D)
    float *wlm_t;  // (D, VP)      columns V..VP-1 zero
#else
    /* avx512_bf16: the weights packed into bf16 pairs (gemm_bf16.h; sizes in floats = pairs) after every
     * update, for the forward GEMMs (W^T, packed straight from W) and the backward ones (W): */
    float *pk_qkv_t; // (L, D/2, 3D)
    float *pk_o_t;   // (L, D/2, D)
    float *pk_f1_t;  // (L, D/2, 4D)
    float *pk_f2_t;  // (L, 2D, D)
    float *pk_lm_t;  // (D/2, VP)   columns V..VP-1 zero
    float *pk_lm;    // (VP/2, D)   rows V..VP-1 zero
    float *pk_f2;    // (L, D/2, 4D)
    float *pk_f1;    // (L, 2D, D)
    float *pk_o;     // (L, D/2, D)
    float *pk_qkv;   // (L, 3D/2, D)
#endif
    void *arena; /* one allocation holding the copies */
    struct emg_acts acts; /* participant 0's */
    struct emg_split *split; /* the thread pool, the chunks and the packed rows (threads.h) */
};

#endif /* EMG_X86_SESSION_H */
