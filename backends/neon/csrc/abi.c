/* The neon backend's hooks for the shared session layer (emg_backend.h): the table of width-specialised
 * kernels and the run-time-width one, the activation arena, and Adam (arm_adam.h, shared with the SME2
 * backends). The layer adds every exported emg_* function and its checks. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign under -std=c11 */
#include <stdlib.h>
#include <string.h>

#include "arm_adam.h"
#include "session.h"

static const emg_neon_kernel *const KERNELS[] = {
    &emg_neon_kernel_d16,  &emg_neon_kernel_d32,  &emg_neon_kernel_d48,  &emg_neon_kernel_d64,
    &emg_neon_kernel_d80,  &emg_neon_kernel_d96,  &emg_neon_kernel_d112, &emg_neon_kernel_d128,
    &emg_neon_kernel_d144, &emg_neon_kernel_d160, &emg_neon_kernel_d176, &emg_neon_kernel_d192,
    &emg_neon_kernel_d208, &emg_neon_kernel_d224, &emg_neon_kernel_d240, &emg_neon_kernel_d256,
};

_Static_assert(16 * (sizeof KERNELS / sizeof KERNELS[0] + 1) == NEON_WIDE_MIN,
               "the run-time-width step starts where the table ends");

/* The step for a width: its own compiled one, the run-time-width one above them, or NULL. */
static const emg_neon_kernel *find_kernel(int d_model) {
    for (size_t i = 0; i < sizeof KERNELS / sizeof KERNELS[0]; i++)
        if (KERNELS[i]->d_model == d_model) return KERNELS[i];
    if (d_model >= NEON_WIDE_MIN && d_model <= EMG_MAX_D_MODEL && d_model % 16 == 0) return &emg_neon_kernel_wide;
    return NULL;
}

/* Every context, depth and vocabulary the ABI allows (emg_shape_valid, checked first by the layer), widths in
 * steps of 16 (the GEMMs' 16-column tiles). Attention works on whole vectors of a head, so head_dim must be
 * a multiple of 4. */
static int supports(const emg_shape *shape) {
    return find_kernel(shape->d_model) != NULL && (shape->d_model / shape->n_heads) % 4 == 0;
}

/* Carves the arena into the buffers of neon_acts (sizes in session.h); with base NULL it only counts. */
static size_t layout_acts(neon_acts *a, float *base, const emg_shape *shape) {
    const size_t d = (size_t)shape->d_model, rows = (size_t)neon_block_rows(shape);
    const size_t cp = ROUND4((size_t)shape->context), vp = ROUND4((size_t)shape->vocab);
    size_t used = 0;
    /* Every buffer starts on a 64-byte line (sizes rounded up to 16 floats). */
#define TAKE(field, n)                                     \
    do {                                                   \
        (field) = base ? base + used : NULL;               \
        used += ((size_t)(n) + 15) / 16 * 16;              \
    } while (0)
    for (int l = 0; l <= shape->n_layers; l++) {
        neon_layer_acts *la = &a->layer[l];
        TAKE(la->x, rows * d);
        if (l == shape->n_layers) break;
        TAKE(la->h1, rows * d);
        TAKE(la->r1, rows);
        TAKE(la->qkv, rows * 3 * d);
        TAKE(la->probs, (size_t)shape->n_heads * rows * cp);
        TAKE(la->att, rows * d);
        TAKE(la->xm, rows * d);
        TAKE(la->h2, rows * d);
        TAKE(la->r2, rows);
        TAKE(la->hidden, rows * 4 * d);
    }
    TAKE(a->r0, rows);
    TAKE(a->logits, rows * vp);
    TAKE(a->dx, rows * d);
    TAKE(a->dh, rows * d);
    TAKE(a->datt, rows * d);
    TAKE(a->dqkv, rows * 3 * d);
    TAKE(a->dpre, rows * 4 * d);
    TAKE(a->dscores, rows * cp);
#undef TAKE
    return used;
}

static int init(emg_session *s) {
    s->kernel = find_kernel(s->core.shape.d_model);
    const size_t n = layout_acts(&s->acts, NULL, &s->core.shape);
    void *p = NULL;
    if (posix_memalign(&p, 64, n * sizeof(float)) != 0) return EMG_ERR_NOMEM;
    memset(p, 0, n * sizeof(float));
    s->arena = p;
    layout_acts(&s->acts, s->arena, &s->core.shape);
    return EMG_OK;
}

static void release(emg_session *s) { free(s->arena); }

/* The kernels read the parameters directly (no derived copies to rebuild). */
static void params_changed(emg_session *s) { (void)s; }

static float loss_and_grad(emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths,
                           int want_grads) {
    return s->kernel->loss_and_grad(s, batch, tokens, lengths, want_grads);
}

static void adam(emg_session *s, float lr) {
    emg_core *c = &s->core;
    adam_update(c->params, c->grads, c->adam_m, c->adam_v, c->layout.n_params, &c->opt, c->step, lr,
                ADAM_G2_SQUARE_FIRST);
}

/* Designated: the optional hooks (train_step, set_threads) stay NULL, and later hooks need no edit. */
const emg_backend emg_this_backend = {.supports = supports, .init = init, .release = release,
                                      .params_changed = params_changed, .loss_and_grad = loss_and_grad,
                                      .adam = adam};

#define EMG_BACKEND_IMPLEMENTATION
#include "emg_backend.h"
