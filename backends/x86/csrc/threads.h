/* Splitting a session's step across its thread pool (pool.h): a batch's sequences become chunks of packed
 * rows, a partition fixed by the batch size alone; each chunk's weight gradient is its own sum, the chunks'
 * gradients are added in chunk order, and Adam and the transposed copies are split by parameter ranges
 * (elementwise work). So every thread count gives bit-identical losses and parameters, and the count can
 * change between any two calls. One thread (what a caller that never calls emg_set_threads gets) runs the
 * chunks one after another inline, with no pool. */
#ifndef EMG_X86_THREADS_H
#define EMG_X86_THREADS_H

#include <stdint.h>

#include "gemm.h"
#include "pool.h"

#define EMG_X86_MAX_THREADS 64

struct emg_session;

/* A chunk of a step: sequences seq0..seq1-1 packed into `rows` live rows from row0. */
struct emg_chunk {
    int seq0, seq1, row0, rows;
};

/* Part of a pass (step_impl.h): `rows` rows from the pass's row `row`, one block of one chunk. Its weight
 * gradients go to `grads` as `mode` says: written (the chunk's first block), continued (a later block: one
 * chain of FMAs over the chunk's rows), or folded (a one-block chunk whose participant also ran every chunk
 * before it: its sum is added to theirs in `grads`, the add emg_x86_reduce would do, without the chunk's own
 * buffer or the pass over it). Its embedding-table gradients, sums of scatter-adds, always go to the chunk's
 * own buffer `own` (its first block zeroes them). Its loss sum is added to *total. */
struct emg_segment {
    int row, rows;
    enum tn_mode mode;
    float *grads, *own;
    double *total;
};

/* What one participant runs at once over its activation rows: the sequences seq0..seq1-1, packed in `rows`
 * rows from row data_row, made of the blocks of one or more consecutive chunks. */
struct emg_pass {
    int seq0, seq1, data_row, rows, n_seg;
    struct emg_segment seg[4]; /* at most one block per chunk: EMG_X86_MAX_CHUNKS */
};

struct emg_acts;

/* The pool and the activations of participants 1..n-1 (participant 0 uses the session's). */
struct emg_threads {
    struct emg_pool *pool;
    int n;
    struct emg_acts *acts; /* n - 1 */
};

/* A batch is split into chunks by its size alone (emg_x86_chunks: 1 below batch 8, 2 from batch 8, 4 from
 * batch 128), so the summation order, and every bit of the result, is the same whatever the thread count.
 * Participant tid of n runs a consecutive range of chunks (emg_x86_participant_chunks); more threads than
 * chunks leave the extra ones only the parameter-range work. Why so few chunks: every chunk beyond the first
 * costs any thread count its own weight-gradient tiles and one more gradient sum (an add per tile element
 * when folded, emg_segment; a pass over its buffer otherwise), and chunks smaller than a
 * block (BLOCK_ROWS, ~32 names) split each weight-gradient GEMM further; with 4 sequences per chunk (the
 * smallest that pays on 2 cores: batch 8 runs 1.31x faster on 2 threads) a one-thread d128 step at batch
 * 16 and 64 ran 4-6% slower than one chunk (backends/x86/README.md, "Threads"). */
#define EMG_X86_MAX_CHUNKS 4
_Static_assert(EMG_X86_MAX_CHUNKS <= sizeof(((struct emg_pass *)0)->seg) / sizeof(struct emg_segment),
               "a pass holds a segment per chunk");

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
    int chunks;                        /* this batch's chunks (emg_x86_chunks) */
    double totals[EMG_X86_MAX_CHUNKS]; /* loss sum per chunk */
    int folded[EMG_X86_MAX_CHUNKS];    /* the chunk's weight gradients were folded into grads (emg_segment) */
    int bad[EMG_X86_MAX_THREADS];       /* a participant's share of the summed gradient is not finite */
    int params_bad[EMG_X86_MAX_THREADS]; /* a parameter of its Adam share is not finite after the update */
    int updated;                         /* Adam ran (every participant's share) */
};

/* The session's pool (NULL with one thread) and its participant count. */
struct emg_pool *emg_x86_pool(const struct emg_session *s);
int emg_x86_threads(const struct emg_session *s);

/* How many chunks a batch of `batch` sequences is split into (see EMG_X86_MAX_CHUNKS). */
int emg_x86_chunks(int batch);

/* The chunk count of a session's largest batch: how many chunk gradient buffers it needs. */
int emg_x86_max_chunks(const struct emg_session *s);

/* Participant tid of n runs chunks [*c0, *c1) of `chunks` (consecutive; empty when n > chunks). */
void emg_x86_participant_chunks(int chunks, int tid, int n, int *c0, int *c1);

/* Set up job->chunks, job->pool and job->n for a batch (one chunk or one thread: inline, no pool). */
void emg_x86_job_participants(struct emg_step_job *job, int batch);

/* Pack the batch's live positions into s->chunks 0..chunks-1 (each from a ROW_PAD-aligned row, with about
 * equal live rows) and return the total number of live rows. */
int emg_x86_pack(struct emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths, int chunks);

/* The buffer chunk c's gradient is written to (grads itself for chunk 0; NULL when grads is NULL). */
float *emg_x86_chunk_grads(const struct emg_session *s, int c, float *grads);

/* Allocate and free the session's gradient buffers of chunks 1..max_chunks-1 (init and release). */
int emg_x86_chunk_grads_alloc(struct emg_session *s);
void emg_x86_chunk_grads_free(struct emg_session *s);

/* Inside a region, after participant tid's chunks: wait for every chunk; then, unless the loss is not
 * finite, add chunks 1..chunks-1's gradients into job->grads over tid's share of the parameters (always in
 * chunk order; of a folded chunk only its embedding tables) and, when training and every summed gradient is finite (the shared layer's gate), run Adam
 * (update s->core.step + 1) on that share and wait for every share. Returns 1 when the parameters were
 * updated (the transposed copies are then stale). */
int emg_x86_reduce(struct emg_step_job *job, int tid, int n);

/* [lo, hi) of participant tid's share of the parameters (Adam, the gradient sum): whole 16-float blocks. */
void emg_x86_share(long n_params, int tid, int n, long *lo, long *hi);

/* The rows [*row_lo, *row_hi) of the rows x ld matrix at parameter offset `off` that participant tid rebuilds
 * the transposed copy of: those starting in its share, the boundaries rounded to multiples of `tile` rows.
 * So a participant reads the weights its own Adam just wrote (in its cache), not the other cores'. */
void emg_x86_share_rows(long n_params, long off, int rows, int ld, int tile, int tid, int n, int *row_lo,
                        int *row_hi);

/* After the region: the batch's mean loss (chunk sums added in chunk order). */
float emg_x86_loss(const struct emg_step_job *job);

/* After a training region: the verdict for the shared layer (enum emg_step_verdict). */
int emg_x86_verdict(const struct emg_step_job *job);

/* The shared layer's set_threads hook (emg_set_threads has checked s and n >= 1): n participants per step. */
int emg_x86_set_threads(struct emg_session *s, int n);

/* Release the pool and buffers (the release hook). */
void emg_x86_threads_free(struct emg_session *s);

#endif /* EMG_X86_THREADS_H */
