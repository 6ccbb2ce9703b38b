/* The native ABI (eemicrogpt.h): argument checks, session memory, and the step/Adam loop. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "gemm.h"
#include "session.h"

#define EMG_MAX_BATCH 256
#define EXPORT __attribute__((visibility("default")))

EXPORT int emg_abi_version(void) { return EMG_ABI_VERSION; }

EXPORT int emg_supports(int d_model, int n_heads) { return emg_x86_find_kernel(d_model, n_heads) != NULL; }

static long n_params_for(int d) { return 2L * EMG_VOCAB * d + (long)EMG_MAX_SEQ * d + 12L * d * d; }

/* Carve the arena into the session's buffers; with base NULL only counts floats. Every buffer starts on
 * a 64-byte boundary (sizes are rounded to 16 floats). */
static size_t layout(struct emg_session *s, float *base) {
    const size_t d = (size_t)s->d, rows = (size_t)s->max_rows, np = (size_t)s->n_params;
    size_t off = 0;
#define TAKE(field, count)                                   \
    do {                                                     \
        if (base) s->field = base + off;                     \
        off += ((size_t)(count) + 15) / 16 * 16;             \
    } while (0)
    TAKE(params, np); TAKE(adam_m, np); TAKE(adam_v, np); TAKE(grads, np);
    TAKE(wqkv_t, 3 * d * d); TAKE(wo_t, d * d); TAKE(wf1_t, 4 * d * d); TAKE(wf2_t, 4 * d * d);
    TAKE(wlm_t, d * LOGIT_LD);
    TAKE(x0, rows * d); TAKE(n1, rows * d); TAKE(qkv, rows * 3 * d); TAKE(o, rows * d);
    TAKE(x1, rows * d); TAKE(n2, rows * d); TAKE(hid, rows * 4 * d); TAKE(x2, rows * d);
    TAKE(logits, rows * LOGIT_LD); TAKE(r0, rows); TAKE(r1, rows); TAKE(r2, rows);
    TAKE(att, rows * (size_t)s->h * ATT_ROW);
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

EXPORT int emg_create(int d_model, int n_heads, int max_batch, emg_session **out) {
    if (out == NULL) return EMG_ERR_ARGUMENT;
    *out = NULL;
    if (max_batch < 1) return EMG_ERR_ARGUMENT;
    const struct emg_kernel *k = emg_x86_find_kernel(d_model, n_heads);
    if (k == NULL || max_batch > EMG_MAX_BATCH) return EMG_ERR_UNSUPPORTED;
    struct emg_session *s = calloc(1, sizeof *s);
    if (s == NULL) return EMG_ERR_NOMEM;
    s->k = k;
    s->d = d_model;
    s->h = n_heads;
    s->max_batch = max_batch;
    s->max_rows = (max_batch * (EMG_MAX_SEQ - 1) + ROW_PAD - 1) / ROW_PAD * ROW_PAD
                  + (EMG_X86_MAX_THREADS - 1) * ROW_PAD; /* threads.h: one padded chunk per thread */
    s->n_params = n_params_for(d_model);
    size_t floats = layout(s, NULL);
    s->arena = aligned_alloc(64, floats * sizeof(float));
    s->row_tok = malloc(sizeof(int) * (size_t)s->max_rows * 3);
    if (s->arena == NULL || s->row_tok == NULL) {
        free(s->arena);
        free(s->row_tok);
        free(s);
        return EMG_ERR_NOMEM;
    }
    memset(s->arena, 0, floats * sizeof(float));
    layout(s, s->arena);
    s->row_tgt = s->row_tok + s->max_rows;
    s->row_pos = s->row_tgt + s->max_rows;
    k->sync_transposed(s);
    *out = s;
    return EMG_OK;
}

EXPORT void emg_destroy(emg_session *s) {
    if (s == NULL) return;
    emg_x86_threads_free(s);
    free(s->arena);
    free(s->row_tok);
    free(s);
}

EXPORT int emg_set_state(emg_session *s, const float *params, const float *adam_m, const float *adam_v,
                         int64_t step) {
    if (s == NULL || params == NULL || adam_m == NULL || adam_v == NULL || step < 0) return EMG_ERR_ARGUMENT;
    const size_t bytes = sizeof(float) * (size_t)s->n_params;
    memcpy(s->params, params, bytes);
    memcpy(s->adam_m, adam_m, bytes);
    memcpy(s->adam_v, adam_v, bytes);
    s->step = step;
    s->k->sync_transposed(s);
    return EMG_OK;
}

EXPORT int emg_get_state(const emg_session *s, float *params, float *adam_m, float *adam_v, int64_t *step) {
    if (s == NULL || params == NULL || adam_m == NULL || adam_v == NULL || step == NULL) return EMG_ERR_ARGUMENT;
    const size_t bytes = sizeof(float) * (size_t)s->n_params;
    memcpy(params, s->params, bytes);
    memcpy(adam_m, s->adam_m, bytes);
    memcpy(adam_v, s->adam_v, bytes);
    *step = s->step;
    return EMG_OK;
}

EXPORT int emg_train_steps(emg_session *s, int n_steps, int batch, const uint8_t *tokens,
                           const uint8_t *lengths, const float *lrs, float *losses) {
    if (s == NULL || n_steps <= 0 || lrs == NULL || losses == NULL) return EMG_ERR_ARGUMENT;
    const long tok_stride = (long)batch * EMG_MAX_SEQ;
    /* Check the whole run first so a bad batch late in it cannot leave a half-applied call behind. */
    for (int i = 0; i < n_steps; i++) {
        if (emg_check_batch(batch, s->max_batch, tokens + i * tok_stride, lengths + (long)i * batch) != EMG_OK)
            return EMG_ERR_ARGUMENT;
        if (!isfinite(lrs[i])) return EMG_ERR_ARGUMENT;
    }
    for (int i = 0; i < n_steps; i++) {
        float loss;
        const int status = s->k->train_step(s, batch, tokens + i * tok_stride, lengths + (long)i * batch, lrs[i], &loss);
        if (status != EMG_OK) return status;
        losses[i] = loss;
    }
    return EMG_OK;
}

EXPORT int emg_loss_and_grad(emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths,
                             float *loss, float *grads) {
    if (s == NULL || loss == NULL || emg_check_batch(batch, s->max_batch, tokens, lengths) != EMG_OK)
        return EMG_ERR_ARGUMENT;
    s->k->loss_and_grad(s, batch, tokens, lengths, loss, grads);
    return isfinite(*loss) ? EMG_OK : EMG_ERR_NONFINITE;
}
