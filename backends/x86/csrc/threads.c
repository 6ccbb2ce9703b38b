/* Thread-count setting and the parallel pieces of a step that do not depend on the model shape. */
#include "threads.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adam.h"
#include "pool.h"
#include "session.h"

/* The pool and the activations of participants 1..n-1 (participant 0 uses the session's). */
struct emg_threads {
    struct emg_pool *pool;
    int n;
    struct emg_acts *acts; /* n - 1 */
};

struct emg_split {
    struct emg_threads *threads; /* NULL with one thread */
    /* The chunks of the step being run, and the gradient buffers of chunks 1..max_chunks - 1: */
    struct emg_chunk chunks[EMG_X86_MAX_CHUNKS];
    float *chunk_grads; // (max_chunks - 1, n_params)
    /* Row bookkeeping per packed row (max_rows): input token, target token and position. */
    int *row_tok, *row_tgt, *row_pos;
};

struct emg_pool *emg_x86_pool(const struct emg_session *s) {
    return s->split->threads ? s->split->threads->pool : NULL;
}

int emg_x86_threads(const struct emg_session *s) { return s->split->threads ? s->split->threads->n : 1; }

struct emg_acts *emg_x86_acts(struct emg_session *s, int tid) {
    return tid == 0 ? &s->acts : &s->split->threads->acts[tid - 1];
}

const struct emg_chunk *emg_x86_chunk(const struct emg_session *s, int c) { return &s->split->chunks[c]; }

struct emg_rows emg_x86_rows(const struct emg_session *s) {
    return (struct emg_rows){s->split->row_tok, s->split->row_tgt, s->split->row_pos};
}

static void threads_free(struct emg_threads *t) {
    emg_pool_destroy(t->pool);
    if (t->acts)
        for (int i = 0; i < t->n - 1; i++) emg_x86_acts_free(&t->acts[i]);
    free(t->acts);
    free(t);
}

static void session_threads_free(struct emg_session *s) {
    if (s->split->threads == NULL) return;
    threads_free(s->split->threads);
    s->split->threads = NULL;
}

int emg_x86_set_threads(struct emg_session *s, int n) {
    if (n > EMG_X86_MAX_THREADS) return EMG_ERR_UNSUPPORTED;
    if (n == emg_x86_threads(s)) return EMG_OK;
    session_threads_free(s);
    if (n == 1) return EMG_OK;
    struct emg_threads *t = calloc(1, sizeof *t);
    if (t == NULL) return EMG_ERR_NOMEM;
    t->n = n;
    t->acts = calloc((size_t)(n - 1), sizeof *t->acts);
    int ok = t->acts != NULL;
    for (int i = 0; ok && i < n - 1; i++) ok = emg_x86_acts_alloc(s, &t->acts[i]) == EMG_OK;
    t->pool = ok ? emg_pool_create(n) : NULL;
    if (t->pool == NULL) {
        threads_free(t);
        return EMG_ERR_NOMEM;
    }
    s->split->threads = t;
    return EMG_OK;
}

int emg_x86_chunks(int batch) { return batch < 8 ? 1 : batch < 128 ? 2 : EMG_X86_MAX_CHUNKS; }

/* The chunk count of a session's largest batch: how many chunk gradient buffers it needs. */
static int max_chunks(const struct emg_session *s) { return emg_x86_chunks(s->core.max_batch); }

void emg_x86_participant_chunks(int chunks, int tid, int n, int *c0, int *c1) {
    *c0 = chunks * tid / n;
    *c1 = chunks * (tid + 1) / n;
}

void emg_x86_job_participants(struct emg_step_job *job, int batch) {
    job->chunks = emg_x86_chunks(batch);
    const int threads = emg_x86_threads(job->s);
    job->pool = job->chunks > 1 && threads > 1 ? emg_x86_pool(job->s) : NULL;
    job->n = job->pool ? threads : 1;
}

int emg_x86_pack(struct emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths, int chunks) {
    int P = 0;
    for (int b = 0; b < batch; b++) P += lengths[b] - 1;
    int b = 0, row = 0, done = 0;
    for (int t = 0; t < chunks; t++) {
        struct emg_chunk *c = &s->split->chunks[t];
        /* Twice the live rows packed once this chunk is full: it takes the next sequence while that sequence's
         * middle lies below the target, so a chunk misses its share by at most half a sequence. */
        const long target2 = 2L * P * (t + 1) / chunks;
        c->seq0 = b;
        c->row0 = row;
        c->rows = 0;
        while (b < batch
               && (t == chunks - 1 || c->rows == 0 || 2L * (done + c->rows) + lengths[b] - 1 <= target2)) {
            const uint8_t *tk = tokens + (long)b * emg_seq_len(&s->core.shape);
            for (int i = 0; i + 1 < lengths[b]; i++) {
                const int r = row + c->rows++;
                s->split->row_tok[r] = tk[i];
                s->split->row_tgt[r] = tk[i + 1];
                s->split->row_pos[r] = i;
            }
            b++;
        }
        c->seq1 = b;
        done += c->rows;
        row += c->rows; /* consecutive: a pass may run the rows of several chunks at once */
    }
    return P;
}

float *emg_x86_chunk_grads(const struct emg_session *s, int c, float *grads) {
    if (c == 0 || grads == NULL) return grads;
    return s->split->chunk_grads + (size_t)(c - 1) * (size_t)s->core.layout.n_params;
}

int emg_x86_split_alloc(struct emg_session *s) {
    struct emg_split *sp = calloc(1, sizeof *sp);
    if (sp == NULL) return EMG_ERR_NOMEM;
    s->split = sp;
    sp->row_tok = malloc(sizeof(int) * (size_t)s->max_rows * 3);
    if (sp->row_tok == NULL) return EMG_ERR_NOMEM;
    sp->row_tgt = sp->row_tok + s->max_rows;
    sp->row_pos = sp->row_tgt + s->max_rows;
    const int extra = max_chunks(s) - 1;
    if (extra == 0) return EMG_OK;
    sp->chunk_grads = aligned_alloc(64, sizeof(float) * (size_t)extra * (size_t)s->core.layout.n_params);
    return sp->chunk_grads ? EMG_OK : EMG_ERR_NOMEM;
}

void emg_x86_split_free(struct emg_session *s) {
    if (s->split == NULL) return;
    session_threads_free(s);
    free(s->split->chunk_grads);
    free(s->split->row_tok);
    free(s->split);
    s->split = NULL;
}

void emg_x86_share(long n_params, int tid, int n, long *lo, long *hi) {
    const long blocks = n_params / 16;
    *lo = blocks * tid / n * 16;
    *hi = tid == n - 1 ? n_params : blocks * (tid + 1) / n * 16;
}

/* The first row of participant t's rows (t = n: rows): monotonic in t, so the ranges tile the matrix. */
static int row_boundary(long n_params, long off, int rows, int ld, int tile, int t, int n) {
    if (t == 0) return 0;
    if (t == n) return rows;
    long lo, hi;
    emg_x86_share(n_params, t, n, &lo, &hi);
    long r = lo <= off ? 0 : (lo - off + ld - 1) / ld; /* the first row starting at or after lo */
    r = (r + tile / 2) / tile * tile;
    return r < rows ? (int)r : rows;
}

void emg_x86_share_rows(long n_params, long off, int rows, int ld, int tile, int tid, int n, int *row_lo,
                        int *row_hi) {
    *row_lo = row_boundary(n_params, off, rows, ld, tile, tid, n);
    *row_hi = row_boundary(n_params, off, rows, ld, tile, tid + 1, n);
}

float emg_x86_loss(const struct emg_step_job *job) {
    double total = 0.0;
    int P = 0;
    for (int c = 0; c < job->chunks; c++) {
        total += job->totals[c];
        P += job->s->split->chunks[c].rows;
    }
    return (float)(total / P);
}

/* The clipping factor of the summed gradient (complete: called after the gate's barrier): participant tid sums
 * its consecutive parts, then, after a barrier, every participant adds all parts in part order, so all of them
 * get the same factor, and the same one for any thread count. */
static float clip_scale(struct emg_step_job *job, int tid, int n) {
    const long n_params = job->s->core.layout.n_params;
    int p0, p1;
    emg_x86_participant_chunks(EMG_X86_NORM_PARTS, tid, n, &p0, &p1); /* the same split of a range */
    for (int part = p0; part < p1; part++) {
        long lo, hi;
        emg_x86_share(n_params, part, EMG_X86_NORM_PARTS, &lo, &hi);
        job->norm_parts[part] = grad_sum_squares(job->grads + lo, hi - lo);
    }
    emg_pool_barrier(job->pool);
    double total = 0.0;
    for (int part = 0; part < EMG_X86_NORM_PARTS; part++) total += job->norm_parts[part];
    return emg_clip_scale(total, job->s->core.opt.grad_clip);
}

int emg_x86_reduce(struct emg_step_job *job, int tid, int n) {
    struct emg_session *s = job->s;
    emg_pool_barrier(job->pool);
    if (job->train && !isfinite(emg_x86_loss(job))) return 0; /* every participant sees the same sums */
    long lo, hi;
    emg_x86_share(s->core.layout.n_params, tid, n, &lo, &hi);
    float *grads = job->grads;
    const long tables_end = s->core.layout.layers; /* the embedding tables: [0, tables_end) */
    for (int c = 1; c < job->chunks; c++) {
        const struct emg_chunk *ch = &s->split->chunks[c];
        if (ch->seq1 == ch->seq0) continue; /* an empty chunk wrote nothing */
        const float *g = emg_x86_chunk_grads(s, c, grads);
        const long end = job->folded[c] && tables_end < hi ? tables_end : hi;
        for (long i = lo; i < end; i++) grads[i] += g[i];
    }
    if (!job->train) return 0;
    /* The shared layer's update gate (emg_backend.h): no update unless every summed gradient is finite. */
    job->bad[tid] = !emg_all_finite(grads + lo, hi - lo);
    emg_pool_barrier(job->pool);
    for (int t = 0; t < n; t++)
        if (job->bad[t]) return 0;
    const emg_core *c = &s->core;
    const float scale = c->opt.grad_clip > 0.0f ? clip_scale(job, tid, n) : 1.0f;
    job->params_bad[tid] = adam_update(c->params + lo, c->adam_m + lo, c->adam_v + lo, grads + lo, hi - lo,
                                       c->step + 1, job->lr, &c->opt, scale);
    if (tid == 0) job->updated = 1;
    emg_pool_barrier(job->pool); /* every parameter is updated before any transposed copy is rebuilt */
    return 1;
}

int emg_x86_verdict(const struct emg_step_job *job) {
    if (!job->updated) return EMG_STEP_SKIPPED;
    for (int t = 0; t < job->n; t++)
        if (job->params_bad[t]) return EMG_STEP_UPDATED_NONFINITE;
    return EMG_STEP_UPDATED;
}
