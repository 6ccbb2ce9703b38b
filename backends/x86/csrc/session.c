/* The x86 backend's hooks for the shared session layer (emg_backend.h): its buffers, the step kernels and
 * fused Adam behind the layer's checks and loop, and the thread count (threads.c). */
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "gemm.h"
#ifdef EMG_AMX
#include "gemm_amx.h"
#endif
#include "session.h"
#include "step.h"
#include "threads.h"

/* A compiled step exists for every width 16..256 in steps of 16, and one run-time-width step for the wider
 * multiples of 16 up to EMG_MAX_D_MODEL (step.c). Heads, layers, vocabulary and context are run-time values
 * over the whole of the ABI's range (emg_supports has checked it): attention takes any head_dim >= 4 (not only
 * multiples of 4) and a block holds a sequence of any context (block_rows). */
static int supports(const emg_shape *shape) { return emg_x86_find_kernel(shape->d_model) != NULL; }

/* Carve an arena into buffers; with base NULL only count floats. Every buffer starts on a 64-byte boundary
 * (sizes are rounded to 16 floats). */
#define TAKE(field, count)                                   \
    do {                                                     \
        if (base) (field) = base + off;                      \
        off += ((size_t)(count) + 15) / 16 * 16;             \
    } while (0)

static size_t copies_layout(struct emg_session *s, float *base) {
    const size_t d = (size_t)s->core.shape.d_model, L = (size_t)s->core.shape.n_layers, vp = (size_t)s->logit_ld;
    size_t off = 0;
#ifndef EMG_BF16
    TAKE(s->wqkv_t, L * 3 * d * d); TAKE(s->wo_t, L * d * d); TAKE(s->wf1_t, L * 4 * d * d);
    TAKE(s->wf2_t, L * 4 * d * d); TAKE(s->wlm_t, d * vp);
#else /* sizes in floats: two bf16 per float */
    TAKE(s->pk_qkv_t, L * 3 * d * d / 2); TAKE(s->pk_o_t, L * d * d / 2); TAKE(s->pk_f1_t, L * 2 * d * d);
    TAKE(s->pk_f2_t, L * 2 * d * d); TAKE(s->pk_lm_t, d * vp / 2); TAKE(s->pk_lm, d * vp / 2);
    TAKE(s->pk_f2, L * 2 * d * d); TAKE(s->pk_f1, L * 2 * d * d); TAKE(s->pk_o, L * d * d / 2);
    TAKE(s->pk_qkv, L * 3 * d * d / 2);
#endif
    return off;
}

static size_t acts_layout(const struct emg_session *s, struct emg_acts *a, float *base) {
    const emg_shape *sh = &s->core.shape;
    const size_t d = (size_t)sh->d_model, L = (size_t)sh->n_layers, R = (size_t)a->rows;
    const size_t lanes = (size_t)s->att_lanes;
    size_t off = 0;
    TAKE(a->x, (L + 1) * R * d); TAKE(a->r_emb, R); TAKE(a->n1, L * R * d); TAKE(a->r1, L * R);
    TAKE(a->qkv, L * R * 3 * d); TAKE(a->att, L * R * (size_t)sh->n_heads * lanes); TAKE(a->o, L * R * d);
    TAKE(a->x_mid, L * R * d); TAKE(a->n2, L * R * d); TAKE(a->r2, L * R); TAKE(a->hid, L * R * 4 * d);
    TAKE(a->logits, R * (size_t)s->logit_ld);
    TAKE(a->dx, R * d); TAKE(a->dhid, R * 4 * d); TAKE(a->dn2, R * d); TAKE(a->dx_mid, R * d);
    TAKE(a->dout, R * d); TAKE(a->dqkv, R * 3 * d); TAKE(a->dn1, R * d);
    /* attention's, and in the fp32 builds' run-time-width step also the GEMMs' operand copies (never both at
     * once): gemm_nn_wide's panel, or a weight gradient's strips of A and panels of B over at most R rows */
    size_t scratch = (size_t)attention_scratch(sh->d_model, sh->n_heads, s->att_lanes);
#ifndef EMG_BF16
    const size_t widest_m = (size_t)round_up(4 * (int)d > s->logit_ld ? 4 * (int)d : s->logit_ld, FOLD2_MR);
    const size_t tn = R * (widest_m + NC_MAX * VW);
    if (scratch < WIDE_PANEL_FLOATS) scratch = WIDE_PANEL_FLOATS;
    if (scratch < tn) scratch = tn;
#endif
    TAKE(a->scratch, scratch);
#ifdef EMG_BF16 /* sizes in floats: two bf16 per float */
    const size_t widest = 4 * d > (size_t)s->logit_ld ? 4 * d : (size_t)s->logit_ld;
    /* two rows more: a pass's two segments packed one after the other, each rounded up to even (gemm_bf16.h);
     * bf_b also holds the run-time-width step's panel copies: a reduction of at most max(4D, VP) rows in pairs */
#ifdef EMG_AMX
    /* gemm_amx.h pads rows, columns and reductions to its 32 x 32 blocks: at most 31 more of each, twice over
     * the rows for a weight gradient's two segments */
    const size_t panel = (widest + 32) / 2 * NC_MAX * VW, tn_b = (R + 64) * (widest + 32) / 2;
    TAKE(a->bf_a, (R + 64) * (widest + 32) / 2); TAKE(a->bf_b, tn_b > panel ? tn_b : panel);
#else
    const size_t panel = widest / 2 * NC_MAX * VW;
    TAKE(a->bf_a, (R + 2) * widest / 2); TAKE(a->bf_b, (R + 2) * 2 * d > panel ? (R + 2) * 2 * d : panel);
#endif
#endif
    return off;
}
#undef TAKE

int emg_x86_acts_alloc(const struct emg_session *s, struct emg_acts *a) {
    const long live = (long)s->core.max_batch * s->core.shape.context;
    a->rows = live < s->block_rows ? round_up((int)live, ROW_PAD) : s->block_rows;
    const size_t bytes = acts_layout(s, a, NULL) * sizeof(float);
    a->arena = aligned_alloc(64, bytes);
    if (a->arena == NULL) return EMG_ERR_NOMEM;
    memset(a->arena, 0, bytes);
    acts_layout(s, a, a->arena);
    return EMG_OK;
}

/* Live rows per block (session.h): one whole sequence at least, BLOCK_ROWS, and for the run-time-width step's
 * widths up to WIDE_BLOCK_ROWS within WIDE_BLOCK_BYTES (in proportion to the activations WIDE_BLOCK_ROWS would take:
 * they grow with the rows, plus a little that does not). */
static int block_rows(const struct emg_session *s) {
    const int one_seq = round_up(s->core.shape.context, ROW_PAD), base = one_seq > BLOCK_ROWS ? one_seq : BLOCK_ROWS;
    if (s->core.shape.d_model < STEP_WIDE_MIN) return base;
    struct emg_acts wide = {.rows = WIDE_BLOCK_ROWS};
    const double bytes = (double)acts_layout(s, &wide, NULL) * sizeof(float);
    int rows = (int)(WIDE_BLOCK_ROWS * (WIDE_BLOCK_BYTES / bytes)) / ROW_PAD * ROW_PAD;
    if (rows > WIDE_BLOCK_ROWS) rows = WIDE_BLOCK_ROWS;
    return rows > base ? rows : base;
}

void emg_x86_acts_free(struct emg_acts *a) {
    free(a->arena);
    a->arena = NULL;
}

static int init(struct emg_session *s) {
    const emg_shape *sh = &s->core.shape;
#ifdef EMG_AMX
    if (!amx_request()) return EMG_ERR_UNSUPPORTED; /* a kernel that does not hand out AMX state */
#endif
    s->k = emg_x86_find_kernel(sh->d_model);
    s->logit_ld = round_up(sh->vocab, 16);
    s->att_lanes = att_lanes(sh->context);
    s->max_rows = round_up(s->core.max_batch * sh->context, ROW_PAD);
    s->block_rows = block_rows(s);
    const size_t bytes = copies_layout(s, NULL) * sizeof(float);
    s->arena = aligned_alloc(64, bytes);
    if (s->arena == NULL) return EMG_ERR_NOMEM;
    memset(s->arena, 0, bytes); /* the padding columns of the LM head's copies stay zero */
    copies_layout(s, s->arena);
    const int status = emg_x86_split_alloc(s);
    return status != EMG_OK ? status : emg_x86_acts_alloc(s, &s->acts);
}

static void release(struct emg_session *s) {
    emg_x86_split_free(s);
    emg_x86_acts_free(&s->acts);
    free(s->arena);
}

const emg_backend emg_this_backend = {.supports = supports, .init = init, .release = release,
                                      .params_changed = emg_x86_sync_transposed,
                                      .loss_and_grad = emg_x86_loss_and_grad,
                                      .train_step = emg_x86_train_step, .set_threads = emg_x86_set_threads};

#define EMG_BACKEND_THREADS
#define EMG_BACKEND_IMPLEMENTATION
#include "emg_backend.h"
