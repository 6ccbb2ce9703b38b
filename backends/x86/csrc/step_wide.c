/* The step for widths above step.c's specialisations (272..EMG_MAX_D_MODEL in steps of 16): step_impl.h's
 * functions compiled once with the width as a run-time value. Its GEMMs are out-of-line copies of run-time
 * width (panels of NC_MAX vectors, EMG_STEP_WIDE in step_impl.h) and its attention one copy per head-count
 * path; at these widths each GEMM's reduction is hundreds of FMAs per output, so what a specialisation saves
 * (unrolled per-site tiles, a constant width) matters little, and one copy keeps the build's compile time. */
#define EMG_STEP_WIDE
#include "step_impl.h"

NOT_INLINED void attention_forward_wide(int D, int H, const float *qkv, float *o, float *att, int L,
                                        float *scratch) {
    attention_forward_seq(D, H, qkv, o, att, L, scratch);
}

NOT_INLINED void attention_backward_wide(int D, int H, const float *qkv, const float *att, const float *dout,
                                         float *dqkv, int L, float *scratch) {
    attention_backward_seq(D, H, qkv, att, dout, dqkv, L, scratch);
}

static void pass_step_wide(struct emg_session *s, struct emg_acts *a, const struct emg_pass *pass,
                           const uint16_t *lengths, float inv_p) {
    pass_step(s->core.shape.d_model, attention_forward_wide, attention_backward_wide, s, a, pass, lengths, inv_p);
}

static void sync_part_wide(void *ctx, int tid, int n) {
    struct emg_session *s = ctx;
    sync_part(s->core.shape.d_model, s, tid, n);
}

const struct emg_x86_kernel emg_x86_wide_kernel = {0, pass_step_wide, sync_part_wide, HAVE_TN_FOLD2};
/* Below SHARED_PASS_MIN (widths a library runs here without a specialisation: amx_bf16's, the sanitized build's)
 * two threads run a chunk each, as the specialisations do: a shared pass's barriers cost more than its split
 * saves. amx_bf16, two threads, batch 16, Intel Xeon, shared / unshared: 59 / 27 us at d16, 101 / 54 at d32,
 * 173 / 102 at d64, 381 / 323 at d128, 1327 / 1414 at d256 (benchmarks/native_ab.py, wall clock, 7 rounds). */
const struct emg_x86_kernel emg_x86_wide_kernel_unshared = {0, pass_step_wide, sync_part_wide, 0};
