/*
 * The shared native session layer: everything in the ABI of eemicrogpt.h except the maths.
 *
 * A native backend supplies kernels only. It defines its session as
 *
 *     struct emg_session { emg_core core; ...its own buffers... };
 *
 * and one `const emg_backend emg_this_backend = {...}` (the hooks below). At the end of exactly one .c file,
 * where that struct is complete, it writes `#define EMG_BACKEND_IMPLEMENTATION` and includes this header
 * (again). That defines every exported emg_* function, so each backend inherits the same argument and
 * batch checks, status codes, session lifecycle, step counting and non-finite rules:
 *
 *   emg_create     EMG_ERR_ARGUMENT for a NULL shape or out, or max_batch < 1; EMG_ERR_UNSUPPORTED for a shape the
 *                  model forbids or the backend has no kernel for, or max_batch > EMG_MAX_BATCH. The layer
 *                  allocates the session and the four n_params buffers (64-byte aligned, zeroed), then
 *                  calls init for the backend's own buffers.
 *   emg_train_steps  checks every step's batch and learning rate before touching the state (a bad one
 *                  anywhere is EMG_ERR_ARGUMENT with nothing changed). Then per step: loss and gradient;
 *                  losses[i] is written (the loss before this step's update) even when it is not finite;
 *                  a non-finite loss or gradient is EMG_ERR_NONFINITE with the state as after the last
 *                  finite step; else step += 1, adam, params_changed; parameters that are not finite after
 *                  the update are EMG_ERR_NONFINITE (the state is then the one that update produced).
 *                  losses of steps that did not run are set to NaN.
 *   emg_loss_and_grad  the same batch checks; a non-finite loss (or gradient, when asked for) is
 *                  EMG_ERR_NONFINITE. The training state is not changed.
 *   emg_set_optimizer  EMG_ERR_ARGUMENT for a NULL pointer or !emg_optimizer_valid, else stored in
 *                  s->core.opt for every later step (emg_create starts it at emg_default_optimizer()).
 *   emg_set_threads  exported only by a backend that defines EMG_BACKEND_THREADS (eemicrogpt.h calls it an
 *                  optional export; a library without it runs on one thread): EMG_ERR_ARGUMENT for a NULL
 *                  session or n < 1, else the backend's set_threads hook decides.
 *
 * Without train_step, the layer clips the gradient (emg_clip_gradients, after the finiteness gate) and the
 * backend's adam hook applies s->core.opt's decay, betas and eps. A backend may fuse a whole step into one
 * pass (e.g. one thread-pool region) with the optional train_step hook; the layer then calls it instead of
 * loss_and_grad, adam and params_changed, and still owns the checks, the step count, the losses and the
 * status codes above; the hook applies all of s->core.opt itself (clipping included: emg_clip_scale turns
 * its sum of squares into the factor). The hook judges finiteness itself, by
 * emg_all_finite's rule, where it already has the data in cache (the update gate over the summed gradient,
 * Adam's pass over the parameters), and returns its verdict (enum emg_step_verdict): a re-check by the layer
 * read the gradient and the parameters once more per step (1-4% of an x86 step on one Zen 4 core).
 *
 * The parameter layout lives here too (EMG_LAYER_* and emg_layout_of); tests/test_native_layer.py checks it
 * against eemicrogpt_core/model/shape.py.
 */
#ifndef EMG_BACKEND_H
#define EMG_BACKEND_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eemicrogpt.h"

/* ---- the parameter layout (model.py's order: tok_emb, pos_emb, per layer Wq Wk Wv Wo Wf1 Wf2, Wlm) ---- */
/* Offsets of a layer's tensors from the start of that layer, in floats (d = d_model). */
#define EMG_LAYER_WQ(d) 0L
#define EMG_LAYER_WK(d) ((long)(d) * (d))
#define EMG_LAYER_WV(d) (2L * (d) * (d))
#define EMG_LAYER_WO(d) (3L * (d) * (d))
#define EMG_LAYER_WF1(d) (4L * (d) * (d))
#define EMG_LAYER_WF2(d) (8L * (d) * (d))
#define EMG_LAYER_SIZE(d) (12L * (d) * (d))

/* Where each tensor starts in the flat buffer, in floats. Layer l's Wq is at layer(l) + EMG_LAYER_WQ(d), and
 * so on; Wq, Wk and Wv are adjacent, so they form one [3D][D] matrix. */
typedef struct emg_layout {
    long n_params;
    long tok_emb, pos_emb; /* [vocab][d], [context][d] */
    long layers;           /* layer 0's Wq; layer l starts at layers + l * layer_size */
    long layer_size;       /* EMG_LAYER_SIZE(d) */
    long wlm;              /* [vocab][d] */
} emg_layout;

static inline emg_layout emg_layout_of(const emg_shape *s) {
    const long d = s->d_model;
    emg_layout l;
    l.tok_emb = 0;
    l.pos_emb = (long)s->vocab * d;
    l.layers = l.pos_emb + (long)s->context * d;
    l.layer_size = EMG_LAYER_SIZE(d);
    l.wlm = l.layers + (long)s->n_layers * l.layer_size;
    l.n_params = l.wlm + (long)s->vocab * d;
    return l;
}

/* The offset of layer `layer`'s first tensor (its Wq). */
static inline long emg_layer_offset(const emg_layout *l, int layer) { return l->layers + layer * l->layer_size; }

/* 1 when every x[0..n) is finite. The one non-finite rule: the layer's checks and a fused train_step's
 * verdicts (on any share of an array: the rule is elementwise; a backend may apply it inside a pass of its
 * own, as the x86 Adam does, when that pass flags exactly the elements this function would). */
static inline int emg_all_finite(const float *x, long n) {
    uint32_t worst = 0; /* the largest magnitude's bits: a max-reduction the compiler vectorises */
    for (long i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, x + i, sizeof bits);
        bits &= 0x7fffffffu;
        worst = bits > worst ? bits : worst;
    }
    return worst < 0x7f800000u; /* the exponent is all ones only for Inf and NaN */
}

/* The optimiser a session starts with: the header's Adam constants, no decay, no clipping. */
static inline emg_optimizer emg_default_optimizer(void) {
    emg_optimizer o = {EMG_ADAM_BETA1, EMG_ADAM_BETA2, EMG_ADAM_EPS, 0.0f, 0.0f};
    return o;
}

/* The factor a step multiplies its gradient by, from the gradient's sum of squares (accumulated in double):
 * clip / norm when clipping is on (clip > 0) and the norm exceeds clip, else exactly 1. */
static inline float emg_clip_scale(double sum_of_squares, float clip) {
    const double norm = sqrt(sum_of_squares);
    return (clip > 0.0f && norm > (double)clip) ? (float)((double)clip / norm) : 1.0f;
}

/* Scale g[0..n) by emg_clip_scale: the sum of squares in double, in index order (any one order gives the same
 * factor to float rounding; a backend that sums in another order says so). Returns the factor applied. */
static inline float emg_clip_gradients(float *g, long n, float clip) {
    if (!(clip > 0.0f)) return 1.0f;
    double sum = 0.0;
    for (long i = 0; i < n; i++) sum += (double)g[i] * g[i];
    const float scale = emg_clip_scale(sum, clip);
    if (scale != 1.0f)
        for (long i = 0; i < n; i++) g[i] *= scale;
    return scale;
}

/* ---- what the layer owns inside every session (the backend's struct emg_session starts with it) ---- */
typedef struct emg_core {
    emg_shape shape; /* valid and supported (checked before init) */
    int max_batch;
    emg_layout layout;
    int64_t step; /* Adam updates applied */
    emg_optimizer opt; /* valid (emg_optimizer_valid): what every update applies */
    float *params, *adam_m, *adam_v; /* the training state, n_params floats each */
    float *grads;                    /* the kernels' gradient output, n_params floats */
} emg_core;

/* What a fused train_step reports: its update gate and its check of the parameters it left behind. */
enum emg_step_verdict {
    EMG_STEP_SKIPPED,           /* the loss or some summed gradient is not finite: no update */
    EMG_STEP_UPDATED,           /* updated, and every parameter is finite */
    EMG_STEP_UPDATED_NONFINITE  /* updated, and some parameter is not finite */
};

/* ---- the kernels a backend supplies ---- */
typedef struct emg_backend {
    /* 1 when kernels exist for this (already valid) shape. Pure: runs no ISA-specific code. */
    int (*supports)(const emg_shape *shape);
    /* Allocate the backend's own buffers; s->core is complete and zeroed. Returns EMG_OK, EMG_ERR_NOMEM
     * or EMG_ERR_UNSUPPORTED (e.g. the CPU lacks a feature). release is called after a failed init too. */
    int (*init)(emg_session *s);
    void (*release)(emg_session *s);
    /* The parameters changed (set_state or an update): rebuild derived copies (transposes, fp16). */
    void (*params_changed)(emg_session *s);
    /* Mean loss of a validated batch; with want_grads, also fills s->core.grads with its gradient. */
    float (*loss_and_grad)(emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths,
                           int want_grads);
    /* One AdamW update from s->core.grads (already clipped) with s->core.opt's decay, betas and eps (the
     * header's "Step"); s->core.step is already counted. Called only when train_step is NULL: a backend that
     * supplies train_step leaves it NULL. */
    void (*adam)(emg_session *s, float lr);
    /* Optional (NULL: the layer runs loss_and_grad, adam, params_changed). One whole step on a validated
     * batch: the loss (into *loss) and its gradient in s->core.grads; then, only when the loss and every
     * gradient are finite (emg_all_finite's rule), the Adam update numbered s->core.step + 1 (the layer
     * counts it) and params_changed's work. Returns the verdict (enum emg_step_verdict; the parameters are
     * judged by emg_all_finite's rule too). */
    int (*train_step)(emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths, float lr,
                      float *loss);
    /* Optional, read only with EMG_BACKEND_THREADS: run each step on n >= 1 threads; same n => bit-identical
     * results. Returns EMG_OK, EMG_ERR_UNSUPPORTED (too many) or EMG_ERR_NOMEM (then one thread). */
    int (*set_threads)(emg_session *s, int n);
} emg_backend;

/* The backend's hooks: defined once by the backend, read only by the layer (never exported). */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((visibility("hidden")))
#endif
extern const emg_backend emg_this_backend;

#endif /* EMG_BACKEND_H */

/* The exported ABI, once per library: see the top of this file. */
#if defined(EMG_BACKEND_IMPLEMENTATION) && !defined(EMG_BACKEND_IMPLEMENTED)
#define EMG_BACKEND_IMPLEMENTED

#if defined(__GNUC__) || defined(__clang__)
#define EMG_API __attribute__((visibility("default")))
#else
#define EMG_API
#endif

static float *emg_alloc_state_(long n) {
    const size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes);
    if (p != NULL) memset(p, 0, bytes);
    return p;
}

static void emg_free_session_(emg_session *s) {
    free(s->core.params);
    free(s->core.adam_m);
    free(s->core.adam_v);
    free(s->core.grads);
    free(s);
}

EMG_API int emg_abi_version(void) { return EMG_ABI_VERSION; }

EMG_API int emg_supports(const emg_shape *shape) {
    return emg_shape_valid(shape) && emg_this_backend.supports(shape);
}

EMG_API int emg_create(const emg_shape *shape, int max_batch, emg_session **out) {
    if (out == NULL || shape == NULL) return EMG_ERR_ARGUMENT;
    *out = NULL;
    if (max_batch < 1) return EMG_ERR_ARGUMENT;
    if (!emg_supports(shape) || max_batch > EMG_MAX_BATCH) return EMG_ERR_UNSUPPORTED;
    emg_session *s = calloc(1, sizeof *s);
    if (s == NULL) return EMG_ERR_NOMEM;
    emg_core *c = &s->core;
    c->shape = *shape;
    c->max_batch = max_batch;
    c->layout = emg_layout_of(shape);
    c->opt = emg_default_optimizer();
    c->params = emg_alloc_state_(c->layout.n_params);
    c->adam_m = emg_alloc_state_(c->layout.n_params);
    c->adam_v = emg_alloc_state_(c->layout.n_params);
    c->grads = emg_alloc_state_(c->layout.n_params);
    int status = (c->params && c->adam_m && c->adam_v && c->grads) ? emg_this_backend.init(s) : EMG_ERR_NOMEM;
    if (status != EMG_OK) {
        emg_this_backend.release(s);
        emg_free_session_(s);
        return status;
    }
    emg_this_backend.params_changed(s);
    *out = s;
    return EMG_OK;
}

EMG_API void emg_destroy(emg_session *s) {
    if (s == NULL) return;
    emg_this_backend.release(s);
    emg_free_session_(s);
}

EMG_API int emg_set_state(emg_session *s, const float *params, const float *adam_m, const float *adam_v,
                          int64_t step) {
    if (s == NULL || params == NULL || adam_m == NULL || adam_v == NULL || step < 0) return EMG_ERR_ARGUMENT;
    const size_t bytes = sizeof(float) * (size_t)s->core.layout.n_params;
    memcpy(s->core.params, params, bytes);
    memcpy(s->core.adam_m, adam_m, bytes);
    memcpy(s->core.adam_v, adam_v, bytes);
    s->core.step = step;
    emg_this_backend.params_changed(s);
    return EMG_OK;
}

EMG_API int emg_get_state(const emg_session *s, float *params, float *adam_m, float *adam_v, int64_t *step) {
    if (s == NULL || params == NULL || adam_m == NULL || adam_v == NULL || step == NULL) return EMG_ERR_ARGUMENT;
    const size_t bytes = sizeof(float) * (size_t)s->core.layout.n_params;
    memcpy(params, s->core.params, bytes);
    memcpy(adam_m, s->core.adam_m, bytes);
    memcpy(adam_v, s->core.adam_v, bytes);
    *step = s->core.step;
    return EMG_OK;
}

EMG_API int emg_set_optimizer(emg_session *s, const emg_optimizer *opt) {
    if (s == NULL || !emg_optimizer_valid(opt)) return EMG_ERR_ARGUMENT;
    s->core.opt = *opt;
    return EMG_OK;
}

EMG_API int emg_train_steps(emg_session *s, int n_steps, int batch, const uint8_t *tokens,
                            const uint16_t *lengths, const float *lrs, float *losses) {
    if (s == NULL || n_steps < 1 || tokens == NULL || lengths == NULL || lrs == NULL || losses == NULL)
        return EMG_ERR_ARGUMENT;
    /* Offsets in size_t: n_steps * batch * (context + 1) can pass INT_MAX. */
    const size_t tok_stride = (size_t)batch * emg_seq_len(&s->core.shape), len_stride = (size_t)batch;
    /* Check the whole call first, so a bad step late in it cannot leave a half-applied call behind. */
    for (int i = 0; i < n_steps; i++) {
        if (emg_check_batch(&s->core.shape, batch, s->core.max_batch, tokens + i * tok_stride,
                            lengths + i * len_stride) != EMG_OK
            || !isfinite(lrs[i]))
            return EMG_ERR_ARGUMENT;
    }
    const long n = s->core.layout.n_params;
    for (int i = 0; i < n_steps; i++) {
        const uint8_t *step_tokens = tokens + i * tok_stride;
        const uint16_t *step_lengths = lengths + i * len_stride;
        float loss;
        int verdict;
        if (emg_this_backend.train_step) {
            verdict = emg_this_backend.train_step(s, batch, step_tokens, step_lengths, lrs[i], &loss);
            if (verdict != EMG_STEP_SKIPPED) s->core.step += 1;
        } else {
            loss = emg_this_backend.loss_and_grad(s, batch, step_tokens, step_lengths, 1);
            verdict = EMG_STEP_SKIPPED; /* the state stays as after the last finite step */
            if (isfinite(loss) && emg_all_finite(s->core.grads, n)) {
                emg_clip_gradients(s->core.grads, n, s->core.opt.grad_clip);
                s->core.step += 1;
                emg_this_backend.adam(s, lrs[i]);
                emg_this_backend.params_changed(s);
                verdict = emg_all_finite(s->core.params, n) ? EMG_STEP_UPDATED : EMG_STEP_UPDATED_NONFINITE;
            }
        }
        losses[i] = loss;
        if (verdict != EMG_STEP_UPDATED) {
            for (int j = i + 1; j < n_steps; j++) losses[j] = NAN;
            return EMG_ERR_NONFINITE;
        }
    }
    return EMG_OK;
}

EMG_API int emg_loss_and_grad(emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths,
                              float *loss, float *grads) {
    if (s == NULL || loss == NULL
        || emg_check_batch(&s->core.shape, batch, s->core.max_batch, tokens, lengths) != EMG_OK)
        return EMG_ERR_ARGUMENT;
    *loss = emg_this_backend.loss_and_grad(s, batch, tokens, lengths, grads != NULL);
    if (!isfinite(*loss)) return EMG_ERR_NONFINITE;
    if (grads == NULL) return EMG_OK;
    const long n = s->core.layout.n_params;
    memcpy(grads, s->core.grads, sizeof(float) * (size_t)n);
    return emg_all_finite(grads, n) ? EMG_OK : EMG_ERR_NONFINITE;
}

#ifdef EMG_BACKEND_THREADS
EMG_API int emg_set_threads(emg_session *s, int n_threads) {
    if (s == NULL || n_threads < 1) return EMG_ERR_ARGUMENT;
    return emg_this_backend.set_threads(s, n_threads);
}
#endif

#endif /* EMG_BACKEND_IMPLEMENTATION */
