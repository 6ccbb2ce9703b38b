/* The training step: one specialisation per width 16..256 in steps of 16 (the GEMM tile shapes depend on the
 * width), compiled from step_impl.h's width-generic functions, the table that also hands the wider widths to
 * step_wide.c's run-time-width step, and the width-independent driver around them (blocks, passes, the
 * participants' parts, the hooks of step.h). */
#include "step.h"

#include <stddef.h>
#include <stdint.h>

#include "pool.h"
#include "session.h"
#include "step_impl.h"
#include "threads.h"

/* The step for one width, every function named literally (so `grep pass_step_d64` finds it here): the
 * width's attention of one sequence (its own copies, not inlined into the pass), the pass (pass_step) and
 * the copies' rebuild (sync_part), each step_impl.h's function with the width as a constant. */
#define EMG_DEFINE_STEP(width, pass_step_w, sync_part_w, attention_forward_w, attention_backward_w)           \
    NOT_INLINED void attention_forward_w(int D_, int H, const float *qkv, float *o, float *att, int L,          \
                                         float *scratch) {                                                     \
        (void)D_;                                                                                              \
        attention_forward_seq(width, H, qkv, o, att, L, scratch);                                              \
    }                                                                                                          \
    NOT_INLINED void attention_backward_w(int D_, int H, const float *qkv, const float *att, const float *dout, \
                                          float *dqkv, int L, float *scratch) {                                \
        (void)D_;                                                                                              \
        attention_backward_seq(width, H, qkv, att, dout, dqkv, L, scratch);                                    \
    }                                                                                                          \
    static void pass_step_w(struct emg_session *s, struct emg_acts *a, const struct emg_pass *pass,            \
                            const uint16_t *lengths, float inv_p) {                                            \
        pass_step(width, attention_forward_w, attention_backward_w, s, a, pass, lengths, inv_p);               \
    }                                                                                                          \
    static void sync_part_w(void *ctx, int tid, int n) { sync_part(width, ctx, tid, n); }

EMG_DEFINE_STEP(16, pass_step_d16, sync_part_d16, attention_forward_seq_d16, attention_backward_seq_d16)
EMG_DEFINE_STEP(32, pass_step_d32, sync_part_d32, attention_forward_seq_d32, attention_backward_seq_d32)
EMG_DEFINE_STEP(48, pass_step_d48, sync_part_d48, attention_forward_seq_d48, attention_backward_seq_d48)
EMG_DEFINE_STEP(64, pass_step_d64, sync_part_d64, attention_forward_seq_d64, attention_backward_seq_d64)
EMG_DEFINE_STEP(80, pass_step_d80, sync_part_d80, attention_forward_seq_d80, attention_backward_seq_d80)
EMG_DEFINE_STEP(96, pass_step_d96, sync_part_d96, attention_forward_seq_d96, attention_backward_seq_d96)
EMG_DEFINE_STEP(112, pass_step_d112, sync_part_d112, attention_forward_seq_d112, attention_backward_seq_d112)
EMG_DEFINE_STEP(128, pass_step_d128, sync_part_d128, attention_forward_seq_d128, attention_backward_seq_d128)
EMG_DEFINE_STEP(144, pass_step_d144, sync_part_d144, attention_forward_seq_d144, attention_backward_seq_d144)
EMG_DEFINE_STEP(160, pass_step_d160, sync_part_d160, attention_forward_seq_d160, attention_backward_seq_d160)
EMG_DEFINE_STEP(176, pass_step_d176, sync_part_d176, attention_forward_seq_d176, attention_backward_seq_d176)
EMG_DEFINE_STEP(192, pass_step_d192, sync_part_d192, attention_forward_seq_d192, attention_backward_seq_d192)
EMG_DEFINE_STEP(208, pass_step_d208, sync_part_d208, attention_forward_seq_d208, attention_backward_seq_d208)
EMG_DEFINE_STEP(224, pass_step_d224, sync_part_d224, attention_forward_seq_d224, attention_backward_seq_d224)
EMG_DEFINE_STEP(240, pass_step_d240, sync_part_d240, attention_forward_seq_d240, attention_backward_seq_d240)
EMG_DEFINE_STEP(256, pass_step_d256, sync_part_d256, attention_forward_seq_d256, attention_backward_seq_d256)

/* The sanitized build (EMG_X86_FEW_WIDTHS: backends/x86/tests/run_sanitized.sh) keeps four specialisations,
 * the narrowest, one that is no power of two, the seed's and the widest, and runs every other width through
 * step_wide.c's run-time-width step, the same step_impl.h source. Instrumented, the sixteen specialisations
 * took most of a half-hour build; the ones left out are unreferenced, so the compiler drops them unbuilt. */
#if defined(EMG_AMX)
/* amx_bf16: every width through the run-time-width step, whose GEMMs are tile products (gemm_amx.h): a tile
 * is 16 x 16 outputs whatever the width, so a per-width copy has nothing to unroll. */
#define KEEP(width) 0
#elif defined(EMG_X86_FEW_WIDTHS)
#define KEEP(width) ((width) == 16 || (width) == 48 || (width) == 64 || (width) == 256)
#else
#define KEEP(width) 1
#endif
#define ENTRY(width, pass_step_w, sync_part_w) \
    {width, KEEP(width) ? pass_step_w : NULL, KEEP(width) ? sync_part_w : NULL, 0}

/* kernels[i] is the step for d_model 16 * (i + 1) (none: the run-time-width step). */
static const struct emg_x86_kernel kernels[] = {
    ENTRY(16, pass_step_d16, sync_part_d16),     ENTRY(32, pass_step_d32, sync_part_d32),
    ENTRY(48, pass_step_d48, sync_part_d48),     ENTRY(64, pass_step_d64, sync_part_d64),
    ENTRY(80, pass_step_d80, sync_part_d80),     ENTRY(96, pass_step_d96, sync_part_d96),
    ENTRY(112, pass_step_d112, sync_part_d112),  ENTRY(128, pass_step_d128, sync_part_d128),
    ENTRY(144, pass_step_d144, sync_part_d144),  ENTRY(160, pass_step_d160, sync_part_d160),
    ENTRY(176, pass_step_d176, sync_part_d176),  ENTRY(192, pass_step_d192, sync_part_d192),
    ENTRY(208, pass_step_d208, sync_part_d208),  ENTRY(224, pass_step_d224, sync_part_d224),
    ENTRY(240, pass_step_d240, sync_part_d240),  ENTRY(256, pass_step_d256, sync_part_d256),
};
_Static_assert(16 * (sizeof kernels / sizeof kernels[0] + 1) == STEP_WIDE_MIN,
               "the run-time-width step takes over after the widest specialisation");

const struct emg_x86_kernel *emg_x86_find_kernel(int d_model) {
    const int i = d_model / 16 - 1;
    if (d_model % 16 != 0 || i < 0 || d_model > EMG_MAX_D_MODEL) return NULL;
    if (i < (int)(sizeof kernels / sizeof kernels[0]) && kernels[i].pass_step != NULL) return &kernels[i];
    return d_model < SHARED_PASS_MIN ? &emg_x86_wide_kernel_unshared : &emg_x86_wide_kernel;
}

void emg_x86_sync_transposed(struct emg_session *s) { emg_pool_run(emg_x86_pool(s), s->k->sync_part, s); }

/* Chunks c0..c1-1 (consecutive sequences and rows): each chunk's sequences in blocks of at most block_rows
 * live rows (one whole sequence at least), as that chunk alone splits them whoever runs it, and the blocks
 * in passes of at most block_rows rows: one pass may end one chunk and start the next, so a participant that
 * runs several small chunks (one thread, batch 16) runs their GEMMs over all their rows at once. Each pass
 * reuses the participant's activation rows: a big batch works in a cache-sized region instead of streaming
 * every activation of the batch through each operation (batch 256 was ~15% slower per sample than batch 64
 * at d64/d128). A chunk's later blocks continue its weight gradients' sums; a one-block chunk after chunk 0's
 * run on the same participant folds them into job->grads (emg_segment); loss sums go to totals. */
static void chunks_step(struct emg_step_job *job, struct emg_acts *a, int c0, int c1, struct emg_pass pass) {
    struct emg_session *s = job->s;
    const pass_step_fn pass_step_w = s->k->pass_step;
    const int block = s->block_rows;
    const int writer = pass.tid == 0; /* of the job's per-chunk fields, when a pass is shared */
    pass.seq0 = emg_x86_chunk(s, c0)->seq0;
    pass.data_row = emg_x86_chunk(s, c0)->row0;
    for (int c = c0; c < c1; c++) {
        const struct emg_chunk *ch = emg_x86_chunk(s, c);
        float *own = emg_x86_chunk_grads(s, c, job->grads);
        /* Chunks 0..c-1 ran here, in order, before this one, and 1..c-1 were folded: job->grads holds their sum
         * in chunk order, and this chunk's sum added to it is what emg_x86_reduce would add next. */
        const int fold = c0 == 0 && c > 0 && job->grads != NULL && ch->rows <= block
                         && (c == 1 || job->folded[c - 1]);
        if (writer) {
            job->folded[c] = fold;
            job->totals[c] = 0.0;
        }
        for (int b = ch->seq0, done = 0; b < ch->seq1;) {
            int rows = job->lengths[b] - 1;
            for (b++; b < ch->seq1 && rows + job->lengths[b] - 1 <= block; b++) rows += job->lengths[b] - 1;
            if (pass.n_seg > 0 && pass.rows + rows > block) { /* never in a shared pass: one block of two chunks */
                pass_step_w(s, a, &pass, job->lengths, job->inv_p);
                pass = (struct emg_pass){.seq0 = pass.seq1, .data_row = pass.data_row + pass.rows, .parts = 1,
                                         .own = pass.own};
            }
            const enum tn_mode mode = done > 0 ? TN_CONTINUE : fold ? TN_FOLD : TN_WRITE;
            pass.seg[pass.n_seg++] = (struct emg_segment){.row = pass.rows, .rows = rows, .mode = mode,
                                                          .grads = fold ? job->grads : own, .own = own,
                                                          .total = &job->totals[c]};
            pass.rows += rows;
            pass.seq1 = b;
            done += rows;
        }
    }
    if (pass.n_seg > 0) pass_step_w(s, a, &pass, job->lengths, job->inv_p);
}

/* One participant of a step: its consecutive chunks (emg_x86_participant_chunks), then (once every chunk is
 * done) its share of the chunk-order gradient sum and, when training, of Adam and of the transposed copies. */
static void step_part(void *ctx, int tid, int n) {
    struct emg_step_job *job = ctx;
    struct emg_session *s = job->s;
    struct emg_acts *own = emg_x86_acts(s, tid);
    if (job->shared) { /* both participants run the one pass of both chunks, in participant 0's activations */
        chunks_step(job, emg_x86_acts(s, 0), 0, job->chunks,
                    (struct emg_pass){.parts = 2, .tid = tid, .pool = job->pool, .own = own});
    } else {
        int c0, c1;
        emg_x86_participant_chunks(job->chunks, tid, n, &c0, &c1);
        if (c1 > c0) chunks_step(job, own, c0, c1, (struct emg_pass){.parts = 1, .own = own});
    }
    if (job->grads == NULL) return;
    if (emg_x86_reduce(job, tid, n) && job->train) s->k->sync_part(s, tid, n);
}

/* Whether two participants run the step's one pass together (emg_pass.parts): the kernel can (the run-time
 * widths), there are two of them and two chunks, and both chunks fit one block of activations, which makes the
 * pass the one-thread step's single pass of two segments, its weight gradients the two-segment fold. So the
 * bits are those of every other thread count. */
static int shares_pass(const struct emg_step_job *job) {
    const struct emg_session *s = job->s;
    if (!s->k->shares_pass || job->grads == NULL || job->n != 2 || job->chunks != 2) return 0;
    const int rows0 = emg_x86_chunk(s, 0)->rows, rows1 = emg_x86_chunk(s, 1)->rows;
    return rows0 > 0 && rows1 > 0 && rows0 + rows1 <= s->acts.rows;
}

/* Pack, then run every participant's part of the step; returns the mean loss. */
static float run_step(struct emg_step_job *job, int batch, const uint8_t *tokens) {
    emg_x86_job_participants(job, batch);
    const int P = emg_x86_pack(job->s, batch, tokens, job->lengths, job->chunks);
    job->shared = shares_pass(job);
    job->inv_p = 1.0f / (float)P;
    emg_pool_run(job->pool, step_part, job);
    return emg_x86_loss(job);
}

float emg_x86_loss_and_grad(struct emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths,
                            int want_grads) {
    struct emg_step_job job = {.s = s, .lengths = lengths, .grads = want_grads ? s->core.grads : NULL};
    return run_step(&job, batch, tokens);
}

/* The shared layer's fused step (emg_backend.h train_step): one region for the chunks, the gradient sum,
 * the finiteness gate, Adam and the transposed copies; the layer counts the update and acts on the verdict. */
int emg_x86_train_step(struct emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths, float lr,
                       float *loss) {
    struct emg_step_job job = {.s = s, .lengths = lengths, .grads = s->core.grads, .train = 1, .lr = lr};
    *loss = run_step(&job, batch, tokens);
    return emg_x86_verdict(&job);
}
