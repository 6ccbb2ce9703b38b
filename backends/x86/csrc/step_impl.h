/* One training step specialised for the width D_MODEL (included by step.c once per width); the heads,
 * layers, vocabulary and context are read from s->core.shape. Live positions of a chunk are packed into
 * consecutive rows and every operation runs over all rows of a block before the next starts, so each weight
 * matrix is streamed once per block.
 *
 * Forward per row (microgpt's loop):
 *   x[0] = rms(tok_emb[tok] + pos_emb[t])
 *   per layer l:  n1 = rms(x[l]);  qkv = n1 Wqkv^T;  o = attention(qkv);  x_mid = x[l] + o Wo^T
 *                 n2 = rms(x_mid);  hid = relu(n2 Wf1^T);  x[l + 1] = x_mid + hid Wf2^T
 *   logits = x[L] Wlm^T (no final norm);  loss = mean cross-entropy over the live rows. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(CAT(name, _d), D_MODEL)

#define D D_MODEL
#define F (4 * D_MODEL)

/* The GEMM calls name both operand forms: fp32 B (row-major, ldb) and B packed into bf16 pairs (pk); the
 * avx512_bf16 build (EMG_BF16) uses the packed form and the participant's bf16 scratch rows (bfa, bfb).
 * NN_ANY: an output width known only at run time (the padded vocabulary). */
#ifdef EMG_BF16
#define NN(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi) \
    gemm_nn_bf16(rows, N, K, A, lda, (const uint32_t *)(pk), C, ldc, E, lde, epi, bfa, 0)
#define NN_ANY(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi) \
    gemm_nn_bf16(rows, N, K, A, lda, (const uint32_t *)(pk), C, ldc, E, lde, epi, bfa, 1)
#define TN(M, N, P, A, lda, B, ldb, C, ldc, acc) gemm_tn_bf16(M, N, P, A, lda, B, ldb, C, ldc, acc, bfa, bfb)
#else
#define NN(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi) gemm_nn(rows, N, K, A, lda, B, ldb, C, ldc, E, lde, epi)
#define NN_ANY(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi) \
    gemm_nn_any(rows, N, K, A, lda, B, ldb, C, ldc, E, lde, epi)
#define TN gemm_tn
#endif

/* For y = x W^T with W [N][K] (rows a multiple of ROW_PAD):
 * matmul_forward: out[rows][N] = epi(inp[rows][K] W^T) from the forward copy W^T (w_t) or its bf16 pairs (pk_t),
 *   starting from the residual E for EPI_ADD;
 * matmul_backward: dinp[rows][K] = dout W (masked by the ReLU output E for EPI_MASK) and, per segment of the
 *   pass (the rows of one chunk), dW (+)= dout^T inp over its rows into that chunk's gradient at offset g_off
 *   (added when the segment continues its chunk). */
#define matmul_forward(rows, N, K, out, inp, w_t, pk_t, E, epi) NN(rows, N, K, inp, K, w_t, N, pk_t, out, N, E, N, epi)
#define matmul_backward(n_rows, N, K, dinp, g_off, dout, ld_dout, inp, w, pk, E, epi)                          \
    do {                                                                                                     \
        NN(n_rows, K, N, dout, ld_dout, w, K, pk, dinp, K, E, K, epi);                                      \
        for (int q_ = 0; q_ < pass->n_seg; q_++) {                                                          \
            const struct emg_segment *sg_ = &pass->seg[q_];                                                 \
            TN(N, K, sg_->rows, (dout) + (long)sg_->row * (ld_dout), ld_dout, (inp) + (long)sg_->row * (K), K, \
               sg_->grads + (g_off), K, sg_->mode);                                                         \
        }                                                                                                    \
    } while (0)

/* Layer l's slice of a per-layer copy (fp32 transposed, or bf16 pairs) of `size` floats per layer. */
#define LAYER_COPY(field, l, size) (s->field + (long)(l) * (size))

/* Participant tid of n rebuilds the rows of each transposed copy whose weights its own Adam share updated
 * (threads.h emg_x86_share_rows); avx512_bf16: every n-th 16-row block of each packed copy, the forward ones
 * straight from the weights. */
static void FN(sync_part)(void *ctx, int tid, int n) {
    struct emg_session *s = ctx;
    const float *p = s->core.params, *wlm = p + s->core.layout.wlm;
    const int V = s->core.shape.vocab, VP = s->logit_ld;
#ifndef EMG_BF16
#define TRANSPOSE_OWN(w, rows, cols, dst, ld_dst)                                                          \
    do {                                                                                                   \
        int lo_, hi_;                                                                                      \
        emg_x86_share_rows(s->core.layout.n_params, (w) - p, rows, cols, TILE, tid, n, &lo_, &hi_);        \
        transpose_rows(w, rows, cols, cols, dst, ld_dst, lo_, hi_);                                        \
    } while (0)
#endif
    for (int l = 0; l < s->core.shape.n_layers; l++) {
        const float *w = p + emg_layer_offset(&s->core.layout, l);
        const float *wqkv = w + EMG_LAYER_WQ(D), *wo = w + EMG_LAYER_WO(D), *wf1 = w + EMG_LAYER_WF1(D);
        const float *wf2 = w + EMG_LAYER_WF2(D);
#ifdef EMG_BF16
        pack_pairs_t(wqkv, 3 * D, D, D, 3 * D, (uint32_t *)LAYER_COPY(pk_qkv_t, l, 3 * D * D / 2), tid, n);
        pack_pairs_t(wo, D, D, D, D, (uint32_t *)LAYER_COPY(pk_o_t, l, D * D / 2), tid, n);
        pack_pairs_t(wf1, F, D, D, F, (uint32_t *)LAYER_COPY(pk_f1_t, l, 2 * D * D), tid, n);
        pack_pairs_t(wf2, D, F, F, D, (uint32_t *)LAYER_COPY(pk_f2_t, l, 2 * D * D), tid, n);
        pack_pairs(wf2, F, D, D, F, (uint32_t *)LAYER_COPY(pk_f2, l, 2 * D * D), tid, n);
        pack_pairs(wf1, D, F, F, D, (uint32_t *)LAYER_COPY(pk_f1, l, 2 * D * D), tid, n);
        pack_pairs(wo, D, D, D, D, (uint32_t *)LAYER_COPY(pk_o, l, D * D / 2), tid, n);
        pack_pairs(wqkv, D, 3 * D, 3 * D, D, (uint32_t *)LAYER_COPY(pk_qkv, l, 3 * D * D / 2), tid, n);
#else
        TRANSPOSE_OWN(wqkv, 3 * D, D, LAYER_COPY(wqkv_t, l, 3 * D * D), 3 * D);
        TRANSPOSE_OWN(wo, D, D, LAYER_COPY(wo_t, l, D * D), D);
        TRANSPOSE_OWN(wf1, F, D, LAYER_COPY(wf1_t, l, 4 * D * D), F);
        TRANSPOSE_OWN(wf2, D, F, LAYER_COPY(wf2_t, l, 4 * D * D), D);
#endif
    }
#ifdef EMG_BF16
    pack_pairs_t(wlm, V, D, D, VP, (uint32_t *)s->pk_lm_t, tid, n); /* columns V..VP-1: zero */
    pack_pairs(wlm, D, V, VP, D, (uint32_t *)s->pk_lm, tid, n);      /* rows V..VP-1: zero */
#else
    (void)VP;
    TRANSPOSE_OWN(wlm, V, D, s->wlm_t, s->logit_ld); /* columns V..VP-1 stay zero */
#undef TRANSPOSE_OWN
#endif
}

static void FN(sync_transposed)(struct emg_session *s) { emg_pool_run(emg_x86_pool(s), FN(sync_part), s); }

/* Attention for one sequence of L rows. The head count is a compile-time constant for 4 and 8 heads (the
 * presets' counts: every loop over heads and head features unrolls, the softmax state stays in registers),
 * and so is the lane count for sequences of one query block (L <= VW: every name at the default context with
 * AVX-512); any other head count runs step.c's attention for run-time shapes. Measured at d16 / d32, batch 16:
 * a run-time head count costs 13% / 6% of the step, a run-time lane count 4% / 2%. */
#define ATTENTION_SEQ(call, H, L, ...)                                 \
    do {                                                                \
        if ((H) == 4 && (L) <= VW)                                      \
            call(D, 4, __VA_ARGS__, L, VW, scratch);                    \
        else if ((H) == 4)                                              \
            call(D, 4, __VA_ARGS__, L, att_lanes(L), scratch);          \
        else if (D / 8 >= 4 && (H) == 8 && (L) <= VW)                   \
            call(D, 8, __VA_ARGS__, L, VW, scratch);                    \
        else if (D / 8 >= 4 && (H) == 8)                                \
            call(D, 8, __VA_ARGS__, L, att_lanes(L), scratch);          \
        else                                                            \
            call##_any(D, H, __VA_ARGS__, L, scratch);                  \
    } while (0)

static void FN(attention_forward_seq)(int H, const float *qkv, float *o, float *att, int L, float *scratch) {
    ATTENTION_SEQ(attention_forward, H, L, qkv, o, att);
}

static void FN(attention_backward_seq)(int H, const float *qkv, const float *att, const float *dout, float *dqkv,
                                       int L, float *scratch) {
    ATTENTION_SEQ(attention_backward, H, L, qkv, att, dout, dqkv);
}
#undef ATTENTION_SEQ

/* Forward (and backward into the segments' gradients when they are not NULL) of one pass: the sequences
 * pass->seq0..seq1-1, whose pass->rows live rows are packed from row pass->data_row of the row bookkeeping;
 * their activations are the first rows of the participant's `a`. Every row-wise operation runs over the whole
 * pass; the sums over rows (weight gradients, loss, embedding scatter) run per segment, as its chunk alone
 * would, so merging the blocks of several chunks into one pass changes no bit. */
static void FN(pass_step)(struct emg_session *s, struct emg_acts *a, const struct emg_pass *pass,
                          const uint8_t *lengths, float inv_p) {
    const emg_layout *lay = &s->core.layout;
    const int NL = s->core.shape.n_layers, H = s->core.shape.n_heads, V = s->core.shape.vocab, VP = s->logit_ld;
    const int P = pass->rows, Pp = round_up(P, ROW_PAD), R = a->rows, data_row = pass->data_row;
    const long att_layer = (long)R * H * s->att_lanes;
    const int *row_tok = s->row_tok + data_row, *row_tgt = s->row_tgt + data_row, *row_pos = s->row_pos + data_row;
    const float *params = s->core.params;
#ifdef EMG_BF16
    uint16_t *bfa = (uint16_t *)a->bf_a, *bfb = (uint16_t *)a->bf_b;
#endif
#define ACT(field, l, width) (a->field + (long)(l) * R * (width)) /* layer l's rows of a per-layer activation */
#define LAYER_W(l, tensor) (params + emg_layer_offset(lay, l) + EMG_LAYER_##tensor(D))
#define LAYER_G(l, tensor) (emg_layer_offset(lay, l) + EMG_LAYER_##tensor(D)) /* offset into a gradient */

    /* The embedding and its norm, chained with layer 0's first norm: rmsnorm_apply returns the mean squares
     * of what it writes. Padding rows are zero all the way through the step. */
    float *x0 = a->x;
    encoder_forward(D, params + lay->tok_emb, params + lay->pos_emb, row_tok, row_pos, P, Pp, x0, a->r_emb);
    rmsnorm_scales(a->r_emb, Pp);
    for (int p = 0; p < Pp; p++) a->r1[p] = rmsnorm_apply(D, x0 + p * D, a->r_emb[p], x0 + p * D);
    for (int l = 0; l < NL; l++) {
        float *x = ACT(x, l, D), *n1 = ACT(n1, l, D), *r1 = ACT(r1, l, 1), *qkv = ACT(qkv, l, 3 * D);
        float *att = a->att + l * att_layer, *o = ACT(o, l, D), *x_mid = ACT(x_mid, l, D), *n2 = ACT(n2, l, D);
        float *r2 = ACT(r2, l, 1), *hid = ACT(hid, l, F);
        if (l > 0)
            for (int p = 0; p < Pp; p++) r1[p] = rmsnorm_mean_sq(D, x + p * D);
        rmsnorm_scales(r1, Pp);
        for (int p = 0; p < Pp; p++) (void)rmsnorm_apply(D, x + p * D, r1[p], n1 + p * D);
        matmul_forward(Pp, 3 * D, D, qkv, n1, LAYER_COPY(wqkv_t, l, 3 * D * D), LAYER_COPY(pk_qkv_t, l, 3 * D * D / 2),
                       NULL, EPI_NONE);
        memset(o + P * D, 0, sizeof(float) * (size_t)(Pp - P) * D);
        long att_off = 0;
        for (int b = pass->seq0, r = 0; b < pass->seq1; b++) {
            const int L = lengths[b] - 1;
            FN(attention_forward_seq)(H, qkv + r * 3 * D, o + r * D, att + att_off, L, a->scratch);
            r += L;
            att_off += (long)H * L * att_lanes(L);
        }
        matmul_forward(Pp, D, D, x_mid, o, LAYER_COPY(wo_t, l, D * D), LAYER_COPY(pk_o_t, l, D * D / 2), x, EPI_ADD);
        rmsnorm_forward(D, x_mid, Pp, r2, n2);
        matmul_forward(Pp, F, D, hid, n2, LAYER_COPY(wf1_t, l, 4 * D * D), LAYER_COPY(pk_f1_t, l, 2 * D * D), NULL,
                       EPI_RELU);
        matmul_forward(Pp, D, F, ACT(x, l + 1, D), hid, LAYER_COPY(wf2_t, l, 4 * D * D),
                       LAYER_COPY(pk_f2_t, l, 2 * D * D), x_mid, EPI_ADD);
    }
    const float *x_last = ACT(x, NL, D);
    float *logits = a->logits;
    NN_ANY(Pp, VP, D, x_last, D, s->wlm_t, VP, s->pk_lm_t, logits, VP, NULL, 0, EPI_NONE);

    /* Cross-entropy per segment (its loss sum goes to its chunk's total); the logits rows become
     * dloss/dlogits = (softmax - onehot) / P_total in place. */
    for (int q = 0; q < pass->n_seg; q++) {
        const struct emg_segment *sg = &pass->seg[q];
        *sg->total += crossentropy_forward_backward(logits + (long)sg->row * VP, VP, V, row_tgt + sg->row, sg->rows,
                                                    inv_p);
    }
    if (pass->seg[0].grads == NULL) return;
    memset(logits + P * VP, 0, sizeof(float) * (size_t)(Pp - P) * VP);
    float *dx = a->dx, *dhid = a->dhid, *dn2 = a->dn2, *dx_mid = a->dx_mid, *dout = a->dout, *dqkv = a->dqkv;
    float *dn1 = a->dn1;

    /* LM head: logits = x[L] Wlm^T, Wlm [V][D] */
    matmul_backward(Pp, V, D, dx, lay->wlm, logits, VP, x_last, params + lay->wlm, s->pk_lm, NULL, EPI_NONE);
    for (int l = NL - 1; l >= 0; l--) {
        const float *n1 = ACT(n1, l, D), *r1 = ACT(r1, l, 1), *qkv = ACT(qkv, l, 3 * D), *att = a->att + l * att_layer;
        const float *o = ACT(o, l, D), *n2 = ACT(n2, l, D), *r2 = ACT(r2, l, 1), *hid = ACT(hid, l, F);
        /* MLP: x[l + 1] = x_mid + relu(n2 Wf1^T) Wf2^T; dx holds dloss/dx[l + 1] */
        matmul_backward(Pp, D, F, dhid, LAYER_G(l, WF2), dx, D, hid, LAYER_W(l, WF2), LAYER_COPY(pk_f2, l, 2 * D * D),
                        hid, EPI_MASK);
        matmul_backward(Pp, F, D, dn2, LAYER_G(l, WF1), dhid, F, n2, LAYER_W(l, WF1), LAYER_COPY(pk_f1, l, 2 * D * D),
                        NULL, EPI_NONE);
        for (int p = 0; p < Pp; p++) rmsnorm_backward(D, dn2 + p * D, n2 + p * D, r2[p], dx + p * D, dx_mid + p * D);
        /* attention: x_mid = x[l] + attention(n1 Wqkv^T) Wo^T */
        matmul_backward(Pp, D, D, dout, LAYER_G(l, WO), dx_mid, D, o, LAYER_W(l, WO), LAYER_COPY(pk_o, l, D * D / 2),
                        NULL, EPI_NONE);
        memset(dqkv + P * 3 * D, 0, sizeof(float) * (size_t)(Pp - P) * 3 * D);
        long att_off = 0;
        for (int b = pass->seq0, r = 0; b < pass->seq1; b++) {
            const int L = lengths[b] - 1;
            FN(attention_backward_seq)(H, qkv + r * 3 * D, att + att_off, dout + r * D, dqkv + r * 3 * D, L,
                                       a->scratch);
            r += L;
            att_off += (long)H * L * att_lanes(L);
        }
        /* Q, K, V projections (one GEMM each way: Wq, Wk, Wv are adjacent in the parameter layout) */
        matmul_backward(Pp, 3 * D, D, dn1, LAYER_G(l, WQ), dqkv, 3 * D, n1, LAYER_W(l, WQ),
                        LAYER_COPY(pk_qkv, l, 3 * D * D / 2), NULL, EPI_NONE);
        if (l > 0) /* dloss/dx[l], the next layer down's dloss/dx[l + 1] */
            for (int p = 0; p < Pp; p++)
                rmsnorm_backward(D, dn1 + p * D, n1 + p * D, r1[p], dx_mid + p * D, dx + p * D);
    }
    /* Layer 0's first norm, the embedding norm and the embedding scatter, row by row into each row's chunk. */
    for (int q = 0; q < pass->n_seg; q++) {
        const struct emg_segment *sg = &pass->seg[q];
        float *g_tok = sg->own + lay->tok_emb, *g_pos = sg->own + lay->pos_emb;
        if (sg->mode != TN_CONTINUE) /* the chunk's first block: both tables start from zero */
            memset(g_tok, 0, sizeof(float) * (size_t)(lay->layers - lay->tok_emb));
        for (int p = sg->row; p < sg->row + sg->rows; p++) {
            float dx0[D], de[D];
            rmsnorm_backward(D, dn1 + p * D, a->n1 + p * D, a->r1[p], dx_mid + p * D, dx0);
            rmsnorm_backward(D, dx0, x0 + p * D, a->r_emb[p], NULL, de);
            encoder_backward(D, de, g_tok + row_tok[p] * D, g_pos + row_pos[p] * D);
        }
    }
#undef ACT
#undef LAYER_W
#undef LAYER_G
}

/* Chunks c0..c1-1 (consecutive sequences and rows): each chunk's sequences in blocks of at most BLOCK_ROWS
 * live rows (one whole sequence at least), as that chunk alone splits them whoever runs it, and the blocks
 * in passes of at most BLOCK_ROWS rows: one pass may end one chunk and start the next, so a participant that
 * runs several small chunks (one thread, batch 16) runs their GEMMs over all their rows at once. Each pass
 * reuses the participant's activation rows: a big batch works in a cache-sized region instead of streaming
 * every activation of the batch through each operation (batch 256 was ~15% slower per sample than batch 64
 * at d64/d128). A chunk's later blocks continue its weight gradients' sums; a one-block chunk after chunk 0's
 * run on the same participant folds them into job->grads (emg_segment); loss sums go to totals. */
static void FN(chunks_step)(struct emg_step_job *job, struct emg_acts *a, int c0, int c1) {
    struct emg_session *s = job->s;
    struct emg_pass pass = {.seq0 = s->chunks[c0].seq0, .data_row = s->chunks[c0].row0};
    for (int c = c0; c < c1; c++) {
        const struct emg_chunk *ch = &s->chunks[c];
        float *own = emg_x86_chunk_grads(s, c, job->grads);
        /* Chunks 0..c-1 ran here, in order, before this one, and 1..c-1 were folded: job->grads holds their sum
         * in chunk order, and this chunk's sum added to it is what emg_x86_reduce would add next. */
        const int fold = c0 == 0 && c > 0 && job->grads != NULL && ch->rows <= BLOCK_ROWS
                         && (c == 1 || job->folded[c - 1]);
        job->folded[c] = fold;
        job->totals[c] = 0.0;
        for (int b = ch->seq0, done = 0; b < ch->seq1;) {
            int rows = job->lengths[b] - 1;
            for (b++; b < ch->seq1 && rows + job->lengths[b] - 1 <= BLOCK_ROWS; b++) rows += job->lengths[b] - 1;
            if (pass.n_seg > 0 && pass.rows + rows > BLOCK_ROWS) {
                FN(pass_step)(s, a, &pass, job->lengths, job->inv_p);
                pass = (struct emg_pass){.seq0 = pass.seq1, .data_row = pass.data_row + pass.rows};
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
    if (pass.n_seg > 0) FN(pass_step)(s, a, &pass, job->lengths, job->inv_p);
}

/* One participant of a step: its consecutive chunks (emg_x86_participant_chunks), then (once every chunk is
 * done) its share of the chunk-order gradient sum and, when training, of Adam and of the transposed copies. */
static void FN(step_part)(void *ctx, int tid, int n) {
    struct emg_step_job *job = ctx;
    struct emg_session *s = job->s;
    int c0, c1;
    emg_x86_participant_chunks(job->chunks, tid, n, &c0, &c1);
    if (c1 > c0) FN(chunks_step)(job, emg_x86_acts(s, tid), c0, c1);
    if (job->grads == NULL) return;
    if (emg_x86_reduce(job, tid, n) && job->train) FN(sync_part)(s, tid, n);
}

/* Pack, then run every participant's part of the step; returns the mean loss. */
static float FN(run_step)(struct emg_step_job *job, int batch, const uint8_t *tokens) {
    emg_x86_job_participants(job, batch);
    const int P = emg_x86_pack(job->s, batch, tokens, job->lengths, job->chunks);
    job->inv_p = 1.0f / (float)P;
    emg_pool_run(job->pool, FN(step_part), job);
    return emg_x86_loss(job);
}

static void FN(loss_and_grad)(struct emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths,
                              float *loss_out, float *grads) {
    struct emg_step_job job = {.s = s, .lengths = lengths, .grads = grads};
    *loss_out = FN(run_step)(&job, batch, tokens);
}

/* The shared layer's fused step (emg_backend.h train_step): one region for the chunks, the gradient sum,
 * the finiteness gate, Adam and the transposed copies; the layer counts the update and acts on the verdict. */
static int FN(train_step)(struct emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths, float lr,
                          float *loss) {
    struct emg_step_job job = {.s = s, .lengths = lengths, .grads = s->core.grads, .train = 1, .lr = lr};
    *loss = FN(run_step)(&job, batch, tokens);
    return emg_x86_verdict(&job);
}

static const struct emg_kernel FN(kernel) = {D_MODEL, FN(loss_and_grad), FN(train_step), FN(sync_transposed)};

#undef D
#undef F
#undef FN
#undef NN
#undef NN_ANY
#undef TN
#undef LAYER_COPY
#undef matmul_forward
#undef matmul_backward
