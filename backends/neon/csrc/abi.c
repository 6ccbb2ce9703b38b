/* The eemicrogpt native ABI (eemicrogpt.h) over the specialised Neon kernels: argument checks, session
 * memory, the step loop and Adam. Nothing here aborts or prints. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign under -std=c11 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"

#define EMG_MAX_BATCH 256

static const emg_kernel *const KERNELS[] = {
    &emg_kernel_d16h4, &emg_kernel_d32h4, &emg_kernel_d64h4, &emg_kernel_d128h4, &emg_kernel_d128h8,
};

static const emg_kernel *find_kernel(int d_model, int n_heads) {
    for (size_t i = 0; i < sizeof KERNELS / sizeof KERNELS[0]; i++)
        if (KERNELS[i]->d_model == d_model && KERNELS[i]->n_heads == n_heads) return KERNELS[i];
    return NULL;
}

int emg_abi_version(void) { return EMG_ABI_VERSION; }

int emg_supports(int d_model, int n_heads) { return find_kernel(d_model, n_heads) != NULL; }

static void *alloc_floats(size_t n) {
    void *p = NULL;
    size_t bytes = n > 0 ? n * sizeof(float) : 64;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}

void emg_destroy(emg_session *s) {
    if (!s) return;
    free(s->params);
    free(s->adam_m);
    free(s->adam_v);
    free(s->grads);
    free(s->wt);
    free(s->work);
    free(s);
}

int emg_create(int d_model, int n_heads, int max_batch, emg_session **out) {
    if (!out) return EMG_ERR_ARGUMENT;
    *out = NULL;
    if (max_batch < 1) return EMG_ERR_ARGUMENT;
    const emg_kernel *k = find_kernel(d_model, n_heads);
    if (!k || max_batch > EMG_MAX_BATCH) return EMG_ERR_UNSUPPORTED;
    emg_session *s = calloc(1, sizeof *s);
    if (!s) return EMG_ERR_NOMEM;
    long d = d_model;
    s->kernel = k;
    s->max_batch = max_batch;
    s->n_params = 2 * EMG_VOCAB * d + EMG_MAX_SEQ * d + 12 * d * d;
    s->params = alloc_floats((size_t)s->n_params);
    s->adam_m = alloc_floats((size_t)s->n_params);
    s->adam_v = alloc_floats((size_t)s->n_params);
    s->grads = alloc_floats((size_t)s->n_params);
    s->wt = alloc_floats((size_t)(12 * d * d));
    s->work = alloc_floats(k->work_bytes / sizeof(float) + 1);
    if (!s->params || !s->adam_m || !s->adam_v || !s->grads || !s->wt || !s->work) {
        emg_destroy(s);
        return EMG_ERR_NOMEM;
    }
    *out = s;
    return EMG_OK;
}

int emg_set_state(emg_session *s, const float *params, const float *adam_m, const float *adam_v,
                  int64_t step) {
    if (!s || !params || !adam_m || !adam_v || step < 0) return EMG_ERR_ARGUMENT;
    size_t bytes = sizeof(float) * (size_t)s->n_params;
    memcpy(s->params, params, bytes);
    memcpy(s->adam_m, adam_m, bytes);
    memcpy(s->adam_v, adam_v, bytes);
    s->step = step;
    s->kernel->sync_transposed(s);
    return EMG_OK;
}

int emg_get_state(const emg_session *s, float *params, float *adam_m, float *adam_v, int64_t *step) {
    if (!s || !params || !adam_m || !adam_v || !step) return EMG_ERR_ARGUMENT;
    size_t bytes = sizeof(float) * (size_t)s->n_params;
    memcpy(params, s->params, bytes);
    memcpy(adam_m, s->adam_m, bytes);
    memcpy(adam_v, s->adam_v, bytes);
    *step = s->step;
    return EMG_OK;
}

int emg_loss_and_grad(emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths, float *loss,
                      float *grads) {
    if (!s || !tokens || !lengths || !loss || batch < 1 || batch > s->max_batch) return EMG_ERR_ARGUMENT;
    int status = emg_check_batch(batch, s->max_batch, tokens, lengths);
    if (status != EMG_OK) return status;
    *loss = s->kernel->loss_grad(s, batch, tokens, lengths);
    if (grads) memcpy(grads, s->grads, sizeof(float) * (size_t)s->n_params);
    return isfinite(*loss) ? EMG_OK : EMG_ERR_NONFINITE;
}

int emg_train_steps(emg_session *s, int n_steps, int batch, const uint8_t *tokens, const uint8_t *lengths,
                    const float *lrs, float *losses) {
    if (!s || !tokens || !lengths || !lrs || !losses || n_steps < 1 || batch < 1 || batch > s->max_batch)
        return EMG_ERR_ARGUMENT;
    const long tok_stride = (long)batch * EMG_MAX_SEQ;
    /* Validate every step's batch first, so a bad one late in the run leaves the state untouched. */
    for (int i = 0; i < n_steps; i++) {
        int status = emg_check_batch(batch, s->max_batch, tokens + i * tok_stride, lengths + (long)i * batch);
        if (status != EMG_OK) return status;
    }
    for (int i = 0; i < n_steps; i++) {
        float loss = s->kernel->loss_grad(s, batch, tokens + i * tok_stride, lengths + (long)i * batch);
        losses[i] = loss;
        if (!isfinite(loss)) return EMG_ERR_NONFINITE; /* the update is not applied */
        s->step += 1;
        emg_adam_update(s->params, s->grads, s->adam_m, s->adam_v, s->n_params, s->step, lrs[i]);
        s->kernel->sync_transposed(s);
    }
    return EMG_OK;
}
