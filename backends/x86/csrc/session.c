/* The x86 backend's hooks for the shared session layer (emg_backend.h): its buffers, the step kernels and
 * fused Adam behind the layer's checks and loop, and the thread count (threads.c). */
#include <stdlib.h>
#include <string.h>

#include "adam.h"
#include "attention.h"
#include "gemm.h"
#include "session.h"

static int supports(int d_model, int n_heads) { return emg_x86_find_kernel(d_model, n_heads) != NULL; }

/* Carve the arena into the session's buffers; with base NULL only counts floats. Every buffer starts on
 * a 64-byte boundary (sizes are rounded to 16 floats). */
static size_t layout(struct emg_session *s, float *base) {
    const size_t d = (size_t)s->core.d_model, rows = (size_t)s->max_rows;
    size_t off = 0;
#define TAKE(field, count)                                   \
    do {                                                     \
        if (base) s->field = base + off;                     \
        off += ((size_t)(count) + 15) / 16 * 16;             \
    } while (0)
#ifndef EMG_BF16 /* the bf16 build packs its forward copies straight from the weights */
    TAKE(wqkv_t, 3 * d * d); TAKE(wo_t, d * d); TAKE(wf1_t, 4 * d * d); TAKE(wf2_t, 4 * d * d);
    TAKE(wlm_t, d * LOGIT_LD);
#endif
    TAKE(x0, rows * d); TAKE(n1, rows * d); TAKE(qkv, rows * 3 * d); TAKE(o, rows * d);
    TAKE(x1, rows * d); TAKE(n2, rows * d); TAKE(hid, rows * 4 * d); TAKE(x2, rows * d);
    TAKE(logits, rows * LOGIT_LD); TAKE(r0, rows); TAKE(r1, rows); TAKE(r2, rows);
    TAKE(att, rows * (size_t)s->core.n_heads * ATT_ROW);
    TAKE(dx2, rows * d); TAKE(dhid, rows * 4 * d); TAKE(dn2, rows * d); TAKE(dx1, rows * d);
    TAKE(dout, rows * d); TAKE(dqkv, rows * 3 * d); TAKE(dn1, rows * d);
#ifdef EMG_BF16 /* sizes in floats: two bf16 per float (see session.h) */
    TAKE(pk_qkv_t, 3 * d * d / 2); TAKE(pk_o_t, d * d / 2); TAKE(pk_f1_t, 2 * d * d); TAKE(pk_f2_t, 2 * d * d);
    TAKE(pk_lm_t, d * LOGIT_LD / 2); TAKE(pk_lm, d * LOGIT_LD / 2); TAKE(pk_f2, 2 * d * d); TAKE(pk_f1, 2 * d * d);
    TAKE(pk_o, d * d / 2); TAKE(pk_qkv, 3 * d * d / 2); TAKE(bf_a, rows * 2 * d); TAKE(bf_b, rows * 2 * d);
#endif
#undef TAKE
    return off;
}

static int init(struct emg_session *s) {
    s->k = emg_x86_find_kernel(s->core.d_model, s->core.n_heads);
    s->max_rows = (s->core.max_batch * (EMG_MAX_SEQ - 1) + ROW_PAD - 1) / ROW_PAD * ROW_PAD
                  + (EMG_X86_MAX_THREADS - 1) * ROW_PAD; /* threads.h: one padded chunk per thread */
    const size_t floats = layout(s, NULL);
    s->arena = aligned_alloc(64, floats * sizeof(float));
    s->row_tok = malloc(sizeof(int) * (size_t)s->max_rows * 3);
    if (s->arena == NULL || s->row_tok == NULL) return EMG_ERR_NOMEM;
    memset(s->arena, 0, floats * sizeof(float));
    layout(s, s->arena);
    s->row_tgt = s->row_tok + s->max_rows;
    s->row_pos = s->row_tgt + s->max_rows;
    return EMG_OK;
}

static void release(struct emg_session *s) {
    emg_x86_threads_free(s);
    free(s->arena);
    free(s->row_tok);
}

static void params_changed(struct emg_session *s) { s->k->sync_transposed(s); }

static float loss_and_grad(struct emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths,
                           int want_grads) {
    float loss;
    s->k->loss_and_grad(s, batch, tokens, lengths, &loss, want_grads ? s->core.grads : NULL);
    return loss;
}

/* Unused while train_step is supplied; kept as the plain single-threaded update the layer's contract names. */
static void adam(struct emg_session *s, float lr) {
    const emg_core *c = &s->core;
    /* Its finiteness flag is not needed: the layer checks the parameters after every update. */
    (void)adam_update(c->params, c->adam_m, c->adam_v, c->grads, c->layout.n_params, c->step, lr);
}

static int train_step(struct emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths, float lr,
                      float *loss) {
    return s->k->train_step(s, batch, tokens, lengths, lr, loss);
}

const emg_backend emg_this_backend = {.supports = supports, .init = init, .release = release,
                                      .params_changed = params_changed, .loss_and_grad = loss_and_grad,
                                      .adam = adam, .train_step = train_step, .set_threads = emg_x86_set_threads};

#define EMG_BACKEND_THREADS
#define EMG_BACKEND_IMPLEMENTATION
#include "emg_backend.h"
