/* The neon backend's hooks for the shared session layer (emg_backend.h): the table of specialised step
 * kernels, their buffers, and Adam. The layer adds every exported emg_* function and its checks. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign under -std=c11 */
#include <stdlib.h>
#include <string.h>

#include "session.h"

static const emg_kernel *const KERNELS[] = {
    &emg_kernel_d16h4, &emg_kernel_d32h4, &emg_kernel_d64h4, &emg_kernel_d128h4, &emg_kernel_d128h8,
};

static const emg_kernel *find_kernel(int d_model, int n_heads) {
    for (size_t i = 0; i < sizeof KERNELS / sizeof KERNELS[0]; i++)
        if (KERNELS[i]->d_model == d_model && KERNELS[i]->n_heads == n_heads) return KERNELS[i];
    return NULL;
}

static int supports(int d_model, int n_heads) { return find_kernel(d_model, n_heads) != NULL; }

static void *alloc_floats(size_t n) {
    void *p = NULL;
    size_t bytes = n > 0 ? n * sizeof(float) : 64;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}

static int init(emg_session *s) {
    const long d = s->core.d_model;
    s->kernel = find_kernel(s->core.d_model, s->core.n_heads);
    s->wt = alloc_floats((size_t)(12 * d * d));
    s->work = alloc_floats(s->kernel->work_bytes / sizeof(float) + 1);
    return s->wt && s->work ? EMG_OK : EMG_ERR_NOMEM;
}

static void release(emg_session *s) {
    free(s->wt);
    free(s->work);
}

static void params_changed(emg_session *s) { s->kernel->sync_transposed(s); }

/* The kernels always produce the gradient: sequence-at-a-time backward is the cheap half of the step. */
static float loss_and_grad(emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths,
                           int want_grads) {
    (void)want_grads;
    return s->kernel->loss_grad(s, batch, tokens, lengths);
}

static void adam(emg_session *s, float lr) {
    emg_core *c = &s->core;
    emg_adam_update(c->params, c->grads, c->adam_m, c->adam_v, c->layout.n_params, c->step, lr);
}

/* Designated: the optional hooks (train_step, set_threads) stay NULL, and later hooks need no edit. */
const emg_backend emg_this_backend = {.supports = supports, .init = init, .release = release,
                                      .params_changed = params_changed, .loss_and_grad = loss_and_grad,
                                      .adam = adam};

#define EMG_BACKEND_IMPLEMENTATION
#include "emg_backend.h"
