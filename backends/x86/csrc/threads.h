/* Splitting a session's step across its thread pool (pool.h): a batch's sequences become chunks of packed
 * rows, a partition fixed by the batch size alone; each chunk's weight gradient is its own sum, the chunks'
 * gradients are added in chunk order, and Adam and the transposed copies are split by parameter ranges
 * (elementwise work). So every thread count gives bit-identical losses and parameters, and the count can
 * change between any two calls. One thread (what a caller that never calls emg_set_threads gets) runs the
 * chunks one after another inline, with no pool. */
#ifndef EMG_X86_THREADS_H
#define EMG_X86_THREADS_H

#include <stdint.h>

#define EMG_X86_MAX_THREADS 64

struct emg_acts;
struct emg_pool;
struct emg_session;

/* The session's split state, owned by threads.c (the other units use the functions below): the thread pool
 * and participants 1..n-1's activations, the chunks of the step being run, the gradient buffers of chunks
 * 1..max_chunks - 1 (chunk 0 writes the step's own) and the row bookkeeping of the packed batch. */
struct emg_split;

/* A chunk of a step: sequences seq0..seq1-1 packed into `rows` live rows from row0. */
struct emg_chunk {
    int seq0, seq1, row0, rows;
};

/* The row bookkeeping of the packed batch, per packed row: input token, target token and position. */
struct emg_rows {
    const int *tok, *tgt, *pos;
};

/* A batch is split into chunks by its size alone (emg_x86_chunks: 1 below batch 8, 2 from batch 8, 4 from
 * batch 128), so the summation order, and every bit of the result, is the same whatever the thread count.
 * Participant tid of n runs a consecutive range of chunks (emg_x86_participant_chunks); more threads than
 * chunks leave the extra ones only the parameter-range work. (At the run-time widths two participants run a
 * batch of two one-block chunks as one pass together instead: step.c, shares_pass.) Why so few chunks: every chunk beyond the first
 * costs any thread count its own weight-gradient tiles and one more gradient sum (an add per tile element
 * when folded, step.c's emg_segment; a pass over its buffer otherwise), and chunks smaller than a
 * block (BLOCK_ROWS, ~32 names) split each weight-gradient GEMM further; with 4 sequences per chunk (the
 * smallest that pays on 2 cores: batch 8 runs 1.31x faster on 2 threads) a one-thread d128 step at batch
 * 16 and 64 ran 4-6% slower than one chunk (backends/x86/README.md, "Threads"). */
#define EMG_X86_MAX_CHUNKS 4

/* Gradient clipping's sum of squares runs over this many parts of the parameters, fixed by the parameter count
 * alone (emg_x86_share(n_params, part, EMG_X86_NORM_PARTS)): each part summed in index order, the parts' sums
 * added in part order, so the norm, like everything else, is the same whatever the thread count. Participants
 * take consecutive parts (at least one each: EMG_X86_MAX_THREADS of them at most). */
#define EMG_X86_NORM_PARTS 64
_Static_assert(EMG_X86_MAX_THREADS <= EMG_X86_NORM_PARTS, "every participant sums some part");

/* What every participant of one step reads, and what it leaves behind. */
struct emg_step_job {
    struct emg_session *s;
    struct emg_pool *pool; /* the session's pool, or NULL when the step runs inline on the caller */
    int n;                 /* participants: 1 inline, else the pool's size */
    const uint16_t *lengths;
    float *grads; /* the summed gradient (s->grads when training); NULL: loss only */
    int train;    /* also Adam (with lr, at update s->step + 1) and the transposed copies */
    float lr;
    float inv_p; /* 1 / live rows of the whole batch */
    int chunks;                        /* this batch's chunks (emg_x86_chunks) */
    double totals[EMG_X86_MAX_CHUNKS]; /* loss sum per chunk */
    int folded[EMG_X86_MAX_CHUNKS];    /* the chunk's weight gradients were folded into grads (step.c emg_segment) */
    int shared; /* two participants run the step's one pass together (step_impl.h emg_pass.parts) */
    int bad[EMG_X86_MAX_THREADS];       /* a participant's share of the summed gradient is not finite */
    int params_bad[EMG_X86_MAX_THREADS]; /* a parameter of its Adam share is not finite after the update */
    double norm_parts[EMG_X86_NORM_PARTS]; /* clipping: the summed gradient's sum of squares per part */
    int updated;                         /* Adam ran (every participant's share) */
};

/* Allocate the session's split state (init: one thread, the row bookkeeping for s->max_rows rows, the chunk
 * gradient buffers for its largest batch) and free it with the pool (release). */
int emg_x86_split_alloc(struct emg_session *s);
void emg_x86_split_free(struct emg_session *s);

/* Participant tid's activations (tid 0: the session's own; others: the thread pool's). */
struct emg_acts *emg_x86_acts(struct emg_session *s, int tid);

/* Chunk c of the step being run (after emg_x86_pack), and the packed rows' bookkeeping. */
const struct emg_chunk *emg_x86_chunk(const struct emg_session *s, int c);
struct emg_rows emg_x86_rows(const struct emg_session *s);

/* The session's pool (NULL with one thread) and its participant count. */
struct emg_pool *emg_x86_pool(const struct emg_session *s);
int emg_x86_threads(const struct emg_session *s);

/* How many chunks a batch of `batch` sequences is split into (see EMG_X86_MAX_CHUNKS). */
int emg_x86_chunks(int batch);

/* Participant tid of n runs chunks [*c0, *c1) of `chunks` (consecutive; empty when n > chunks). */
void emg_x86_participant_chunks(int chunks, int tid, int n, int *c0, int *c1);

/* Set up job->chunks, job->pool and job->n for a batch (one chunk or one thread: inline, no pool). */
void emg_x86_job_participants(struct emg_step_job *job, int batch);

/* Pack the batch's live positions into chunks 0..chunks-1 (each from a ROW_PAD-aligned row, with about
 * equal live rows) and return the total number of live rows. */
int emg_x86_pack(struct emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths, int chunks);

/* The buffer chunk c's gradient is written to (grads itself for chunk 0; NULL when grads is NULL). */
float *emg_x86_chunk_grads(const struct emg_session *s, int c, float *grads);

/* Inside a region, after participant tid's chunks: wait for every chunk; then, unless the loss is not
 * finite, add chunks 1..chunks-1's gradients into job->grads over tid's share of the parameters (always in
 * chunk order; of a folded chunk only its embedding tables) and, when training and every summed gradient is
 * finite (the shared layer's gate), run AdamW with s->core.opt (update s->core.step + 1) on that share and wait
 * for every share. With clipping on, the whole summed gradient's sum of squares (EMG_X86_NORM_PARTS) comes
 * first, behind one more barrier. Returns 1 when the parameters were updated (the transposed copies are then
 * stale). */
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

#endif /* EMG_X86_THREADS_H */
