/* Splitting a session's step across its thread pool (pool.h): batch sequences become one chunk of packed
 * rows per participant, weight gradients are summed in a fixed order, Adam and the transposed copies are
 * split by parameter ranges. Same thread count => bit-identical results. One thread (the default, and
 * what a caller that never calls emg_set_threads gets) runs inline with no pool. */
#ifndef EMG_X86_THREADS_H
#define EMG_X86_THREADS_H

#include <stdint.h>

#include "pool.h"

#define EMG_X86_MAX_THREADS 64

struct emg_session;

/* Participant tid's share of a step: sequences seq0..seq1-1 packed into `rows` live rows from row0. */
struct emg_chunk {
    int seq0, seq1, row0, rows;
};

/* The pool and the gradient buffers of participants 1..n-1 (participant 0 writes the caller's buffer). */
struct emg_threads {
    struct emg_pool *pool;
    int n;
    float *grads;
};

/* What every participant of one step reads, and what it leaves behind. */
struct emg_step_job {
    struct emg_session *s;
    const uint8_t *lengths;
    float *grads; /* the summed gradient (s->grads when training); NULL: loss only */
    int train;    /* also Adam (with lr, at update s->step + 1) and the transposed copies */
    float lr;
    float inv_p; /* 1 / live rows of the whole batch */
    double totals[EMG_X86_MAX_THREADS]; /* loss sum per chunk */
    int bad[EMG_X86_MAX_THREADS];       /* a participant's share of the summed gradient is not finite */
};

/* The session's pool (NULL with one thread) and its participant count. */
struct emg_pool *emg_x86_pool(const struct emg_session *s);
int emg_x86_threads(const struct emg_session *s);

/* Pack the batch's live positions into s->chunks (one per participant, each from a ROW_PAD-aligned row)
 * and return the total number of live rows. */
int emg_x86_pack(struct emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths);

/* The buffer participant tid accumulates its chunk's gradient in (grads itself for tid 0). */
float *emg_x86_chunk_grads(const struct emg_session *s, int tid, float *grads);

/* Inside a region, after participant tid's chunk: wait for every chunk; then, unless the loss is not
 * finite, add participants 1..n-1's gradients into job->grads over tid's share of the parameters (always
 * in participant order) and, when training and every summed gradient is finite (the shared layer's gate),
 * run Adam (update s->core.step + 1) on that share and wait for every share. Returns 1 when the parameters
 * were updated (the transposed copies are then stale). */
int emg_x86_reduce(struct emg_step_job *job, int tid, int n);

/* After the region: the batch's mean loss (chunk sums added in participant order). */
float emg_x86_loss(const struct emg_step_job *job);

/* The shared layer's set_threads hook (emg_set_threads has checked s and n >= 1): n participants per step. */
int emg_x86_set_threads(struct emg_session *s, int n);

/* Release the pool and buffers (the release hook). */
void emg_x86_threads_free(struct emg_session *s);

#endif /* EMG_X86_THREADS_H */
