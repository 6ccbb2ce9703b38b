/* The session object behind the ABI's opaque emg_session (the shared layer's emg_core plus the Neon
 * buffers), the activation arena's layout, and the table of width-specialised kernels. */
#ifndef EMG_NEON_SESSION_H
#define EMG_NEON_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "emg_backend.h"

/* Sequence packing: the live positions of consecutive sequences of a batch are laid out back to back in
 * one block of rows, so every position-wise kernel (norms, projections, MLP, LM head) runs over the whole
 * block and each weight-gradient tile is loaded and stored once per block rather than once per sequence.
 * Attention runs per sequence inside the block. A block holds at most neon_block_rows(shape) rows:
 * NEON_BLOCK_ROWS, or one whole sequence when the context is longer, so contexts up to NEON_BLOCK_ROWS keep
 * the block (and the executed instructions) they were measured with. */
#define NEON_BLOCK_ROWS 64
/* The most rows a block can hold (a context of EMG_MAX_CONTEXT); lengths >= 2 give every sequence a row,
 * so this also bounds the sequences of a block. */
#define NEON_MAX_BLOCK_ROWS EMG_MAX_CONTEXT
_Static_assert(NEON_BLOCK_ROWS <= NEON_MAX_BLOCK_ROWS, "a block of NEON_BLOCK_ROWS fits the pack's arrays");

static inline int neon_block_rows(const emg_shape *shape) {
    return shape->context > NEON_BLOCK_ROWS ? shape->context : NEON_BLOCK_ROWS;
}

/* The widths compiled one per translation unit (setup.py's NEON_WIDTHS); wider multiples of 16 up to
 * EMG_MAX_D_MODEL run step_wide.c, the same step with the width a run-time value. */
#define NEON_WIDE_MIN 272

/* Rounds n up to a whole Neon vector of 4 floats: the padded width of rows of logits and attention scores. */
#define ROUND4(n) (((n) + 3) / 4 * 4)

/* Activations of one layer, each a block of R = neon_block_rows(shape) rows (D = d_model, H = n_heads,
 * CP = ROUND4(context)). */
typedef struct neon_layer_acts {
    float *x;      /* [R][D] the residual stream entering the layer */
    float *h1;     /* [R][D] rmsnorm(x), the attention input */
    float *r1;     /* [R] its 1 / rms */
    float *qkv;    /* [R][3D] q | k | v */
    float *probs;  /* [H][R][CP] attention weights of each row over its sequence, 0 past the row */
    float *att;    /* [R][D] attention output (heads side by side) */
    float *xm;     /* [R][D] x + Wo att */
    float *h2;     /* [R][D] rmsnorm(xm), the MLP input */
    float *r2;     /* [R] its 1 / rms */
    float *hidden; /* [R][4D] relu(Wf1 h2) */
} neon_layer_acts;

/* The whole arena: forward activations per layer (kept for the backward pass, which runs the layers in
 * reverse) and the backward pass's scratch, shared by all layers. */
typedef struct neon_acts {
    neon_layer_acts layer[EMG_MAX_LAYERS + 1]; /* layer[L].x only: the last residual, the LM head's input */
    float *r0;      /* [R] 1 / rms of the embeddings (layer[0].x is their norm) */
    float *logits;  /* [R][VP] logits, then d(loss)/d(logits); VP = ROUND4(vocab), 0-padded */
    float *dx;      /* [R][D] gradient on the residual stream */
    float *dh;      /* [R][D] gradient at a norm's output */
    float *datt;    /* [R][D] gradient at the attention output */
    float *dqkv;    /* [R][3D] */
    float *dpre;    /* [R][4D] gradient at the MLP's ReLU input */
    float *dscores; /* [R][CP] one head's gradient at the scaled scores of one sequence */
} neon_acts;

/* One block of packed sequences: sequence i has rows start[i] .. start[i] + len[i] - 1, its tokens tok[i]. */
typedef struct neon_pack {
    int rows, n_seq;
    int start[NEON_MAX_BLOCK_ROWS], len[NEON_MAX_BLOCK_ROWS];
    const uint8_t *tok[NEON_MAX_BLOCK_ROWS];
} neon_pack;

/* The step compiled for one width (step_impl.h, one translation unit per width), or for any width of
 * NEON_WIDE_MIN..EMG_MAX_D_MODEL (step_wide.c, d_model 0). */
typedef struct emg_neon_kernel {
    int d_model;
    /* The shared layer's loss_and_grad hook: the mean loss of a validated batch; with want_grads,
     * s->core.grads is zeroed and then filled with its gradient. */
    float (*loss_and_grad)(emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths,
                          int want_grads);
} emg_neon_kernel;

struct emg_session {
    emg_core core; /* shape, layout, step and the training state: owned by the shared layer */
    const emg_neon_kernel *kernel;
    float *arena;  /* the buffers of acts, one allocation */
    neon_acts acts;
};

/* One table entry per width, each from its own translation unit: setup.py compiles step_impl.h once per
 * width (NEON_WIDTHS) with D_MODEL and KERNEL_NAME defined; step_wide.c compiles it with NEON_STEP_WIDE. */
extern const emg_neon_kernel emg_neon_kernel_d16, emg_neon_kernel_d32, emg_neon_kernel_d48, emg_neon_kernel_d64,
    emg_neon_kernel_d80, emg_neon_kernel_d96, emg_neon_kernel_d112, emg_neon_kernel_d128, emg_neon_kernel_d144,
    emg_neon_kernel_d160, emg_neon_kernel_d176, emg_neon_kernel_d192, emg_neon_kernel_d208, emg_neon_kernel_d224,
    emg_neon_kernel_d240, emg_neon_kernel_d256, emg_neon_kernel_wide;

#endif /* EMG_NEON_SESSION_H */
