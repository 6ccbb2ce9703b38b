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

struct emg_acts;

/* The pool, and the gradient buffers and activations of participants 1..n-1 (participant 0 writes the
 * caller's gradient buffer and uses the session's activations). */
struct emg_threads {
    struct emg_pool *pool;
    int n;
    float *grads;
    struct emg_acts *acts; /* n - 1 */
};

/* What every participant of one step reads, and what it leaves behind. */
struct emg_step_job {
    struct emg_session *s;
    struct emg_pool *pool; /* the session's pool, or NULL when the step runs inline on the caller */
    int n;                 /* participants: 1 inline, else the pool's size */
    const uint8_t *lengths;
    float *grads; /* the summed gradient (s->grads when training); NULL: loss only */
    int train;    /* also Adam (with lr, at update s->step + 1) and the transposed copies */
    float lr;
    float inv_p; /* 1 / live rows of the whole batch */
    double totals[EMG_X86_MAX_THREADS]; /* loss sum per chunk */
    int bad[EMG_X86_MAX_THREADS];       /* a participant's share of the summed gradient is not finite */
    int params_bad[EMG_X86_MAX_THREADS]; /* a parameter of its Adam share is not finite after the update */
    int updated;                         /* Adam ran (every participant's share) */
};

/* The session's pool (NULL with one thread) and its participant count. */
struct emg_pool *emg_x86_pool(const struct emg_session *s);
int emg_x86_threads(const struct emg_session *s);

/* A chunk gets at least this many sequences of the batch: below that, the second core's hand-offs and
 * cache-line transfers cost about what its share of the work saves (2 Zen 4 vCPUs at d64, one chunk per
 * thread: batch 1 was 1.4x slower on 2 threads than on 1, batch 2 1.07x slower, batch 4 only 1.05x faster,
 * batch 8 1.31x faster; README "Threads"). */
#define EMG_X86_MIN_SEQS_PER_CHUNK 4

/* How many chunks a batch is split into with the session's threads: min(threads, batch / MIN_SEQS), at
 * least 1. A function of (threads, batch) only, so a given pair always sums gradients in the same order. */
int emg_x86_chunks(const struct emg_session *s, int batch);

/* Set up job->pool and job->n for a batch split into `chunks` (one chunk: inline, no pool). */
void emg_x86_job_participants(struct emg_step_job *job, int chunks);

/* Pack the batch's live positions into s->chunks 0..chunks-1 (each from a ROW_PAD-aligned row, with about
 * equal live rows), leave chunks chunks..n-1 empty, and return the total number of live rows. */
int emg_x86_pack(struct emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths, int chunks);

/* The buffer participant tid accumulates its chunk's gradient in (grads itself for tid 0). */
float *emg_x86_chunk_grads(const struct emg_session *s, int tid, float *grads);

/* Inside a region, after participant tid's chunk: wait for every chunk; then, unless the loss is not
 * finite, add participants 1..n-1's gradients into job->grads over tid's share of the parameters (always
 * in participant order) and, when training and every summed gradient is finite (the shared layer's gate),
 * run Adam (update s->core.step + 1) on that share and wait for every share. Returns 1 when the parameters
 * were updated (the transposed copies are then stale). */
int emg_x86_reduce(struct emg_step_job *job, int tid, int n);

/* [lo, hi) of participant tid's share of the parameters (Adam, the gradient sum): whole 16-float blocks. */
void emg_x86_share(long n_params, int tid, int n, long *lo, long *hi);

/* The rows [*row_lo, *row_hi) of the rows x ld matrix at parameter offset `off` that participant tid rebuilds
 * the transposed copy of: those starting in its share, the boundaries rounded to multiples of `tile` rows.
 * So a participant reads the weights its own Adam just wrote (in its cache), not the other cores'. */
void emg_x86_share_rows(long n_params, long off, int rows, int ld, int tile, int tid, int n, int *row_lo,
                        int *row_hi);

/* After the region: the batch's mean loss (chunk sums added in participant order). */
float emg_x86_loss(const struct emg_step_job *job);

/* After a training region: the verdict for the shared layer (enum emg_step_verdict). */
int emg_x86_verdict(const struct emg_step_job *job);

/* The shared layer's set_threads hook (emg_set_threads has checked s and n >= 1): n participants per step. */
int emg_x86_set_threads(struct emg_session *s, int n);

/* Release the pool and buffers (the release hook). */
void emg_x86_threads_free(struct emg_session *s);

#endif /* EMG_X86_THREADS_H */
