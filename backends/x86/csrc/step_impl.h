/* One training step specialised for D_MODEL and N_HEADS (included by step.c once per supported shape,
 * with SFX naming the copy). Live positions of the whole batch are packed into consecutive rows and every
 * operation runs over all rows before the next starts, so each weight matrix is streamed once per step.
 *
 * Forward per row:  x0 = rms(tok_emb[x] + pos_emb[t]);  n1 = rms(x0);  qkv = n1 Wqkv^T;  o = attention
 *                   x1 = x0 + o Wo^T;  n2 = rms(x1);  hid = relu(n2 Wf1^T);  x2 = x1 + hid Wf2^T
 *                   logits = x2 Wlm^T;  loss = mean cross-entropy over the live rows. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

#define D D_MODEL
#define F (4 * D_MODEL)

/* The GEMM calls name both operand forms: fp32 B (row-major, ldb) and B packed into bf16 pairs (pk); the
 * avx512_bf16 build (EMG_BF16) uses the packed form and the chunk's bf16 scratch rows (bfa, bfb). */
#ifdef EMG_BF16
#define NN(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi) \
    gemm_nn_bf16(rows, N, K, A, lda, (const uint32_t *)(pk), C, ldc, E, lde, epi, bfa)
#define TN(M, N, P, A, lda, B, ldb, C, ldc, acc) gemm_tn_bf16(M, N, P, A, lda, B, ldb, C, ldc, acc, bfa, bfb)
#else
#define NN(rows, N, K, A, lda, B, ldb, pk, C, ldc, E, lde, epi) gemm_nn(rows, N, K, A, lda, B, ldb, C, ldc, E, lde, epi)
#define TN gemm_tn
#endif

/* Participant tid of n rebuilds the rows of each transposed copy whose weights its own Adam share updated
 * (threads.h emg_x86_share_rows); avx512_bf16: every n-th 16-row block of each packed copy, the forward ones
 * straight from the weights. */
static void FN(sync_part)(void *ctx, int tid, int n) {
    struct emg_session *s = ctx;
    const float *p = s->core.params;
    const float *wqkv = p + EMG_OFF_WQ(D), *wo = p + EMG_OFF_WO(D), *wf1 = p + EMG_OFF_WF1(D);
    const float *wf2 = p + EMG_OFF_WF2(D), *wlm = p + EMG_OFF_WLM(D);
#ifdef EMG_BF16
    pack_pairs_t(wqkv, 3 * D, D, D, 3 * D, (uint32_t *)s->pk_qkv_t, tid, n);
    pack_pairs_t(wo, D, D, D, D, (uint32_t *)s->pk_o_t, tid, n);
    pack_pairs_t(wf1, F, D, D, F, (uint32_t *)s->pk_f1_t, tid, n);
    pack_pairs_t(wf2, D, F, F, D, (uint32_t *)s->pk_f2_t, tid, n);
    pack_pairs_t(wlm, EMG_VOCAB, D, D, LOGIT_LD, (uint32_t *)s->pk_lm_t, tid, n); /* columns VOCAB..31: zero */
    pack_pairs(wlm, D, EMG_VOCAB, round_up(EMG_VOCAB, BF_ALIGN_K), D, (uint32_t *)s->pk_lm, tid, n);
    pack_pairs(wf2, F, D, D, F, (uint32_t *)s->pk_f2, tid, n);
    pack_pairs(wf1, D, F, F, D, (uint32_t *)s->pk_f1, tid, n);
    pack_pairs(wo, D, D, D, D, (uint32_t *)s->pk_o, tid, n);
    pack_pairs(wqkv, D, 3 * D, 3 * D, D, (uint32_t *)s->pk_qkv, tid, n);
#else
#define TRANSPOSE_OWN(w, rows, cols, dst, ld_dst)                                                          \
    do {                                                                                                   \
        int lo_, hi_;                                                                                      \
        emg_x86_share_rows(s->core.layout.n_params, (w) - p, rows, cols, TILE, tid, n, &lo_, &hi_);        \
        transpose_rows(w, rows, cols, cols, dst, ld_dst, lo_, hi_);                                        \
    } while (0)
    TRANSPOSE_OWN(wqkv, 3 * D, D, s->wqkv_t, 3 * D);
    TRANSPOSE_OWN(wo, D, D, s->wo_t, D);
    TRANSPOSE_OWN(wf1, F, D, s->wf1_t, F);
    TRANSPOSE_OWN(wf2, D, F, s->wf2_t, D);
    TRANSPOSE_OWN(wlm, EMG_VOCAB, D, s->wlm_t, LOGIT_LD); /* columns VOCAB..31 stay zero */
#undef TRANSPOSE_OWN
#endif
}

static void FN(sync_transposed)(struct emg_session *s) { emg_pool_run(emg_x86_pool(s), FN(sync_part), s); }

/* Forward (and backward into `grads` when it is not NULL) of one block of a chunk: the sequences
 * blk->seq0..seq1-1, whose blk->rows live rows are packed from row `data_row` of the row bookkeeping; their
 * activations start at row blk->row0 (a multiple of ROW_PAD). The weight gradients are written, or added to
 * grads when `accumulate` (a later block of the chunk). Returns the block's loss sum. */
static double FN(block_step)(struct emg_session *s, const struct emg_chunk *blk, int data_row, const uint8_t *lengths,
                             float inv_p, float *grads, int accumulate) {
    const int P = blk->rows, Pp = (P + ROW_PAD - 1) / ROW_PAD * ROW_PAD, r0 = blk->row0;
    const int *row_tok = s->row_tok + data_row, *row_tgt = s->row_tgt + data_row, *row_pos = s->row_pos + data_row;
    float *x0 = s->x0 + r0 * D, *n1 = s->n1 + r0 * D, *qkv = s->qkv + r0 * 3 * D, *o = s->o + r0 * D;
    float *x1 = s->x1 + r0 * D, *n2 = s->n2 + r0 * D, *hid = s->hid + r0 * F, *x2 = s->x2 + r0 * D;
    float *logits = s->logits + r0 * LOGIT_LD, *rr0 = s->r0 + r0, *rr1 = s->r1 + r0, *rr2 = s->r2 + r0;
    float *att = s->att + r0 * N_HEADS * ATT_ROW;
    const float *tok_emb = s->core.params, *pos_emb = tok_emb + EMG_OFF_POS_EMB(D);
#ifdef EMG_BF16
    uint16_t *bfa = (uint16_t *)(s->bf_a + r0 * 2 * D), *bfb = (uint16_t *)(s->bf_b + r0 * 2 * D);
#endif

    /* Embedding and the two norms (norm.h: each in passes over the rows); padding rows are zero all the way
     * through the step. */
    for (int p = 0; p < Pp; p++) {
        float *e = x0 + p * D;
        if (p < P) {
            const float *te = tok_emb + row_tok[p] * D, *pe = pos_emb + row_pos[p] * D;
            for (int i = 0; i < D; i += VW) v_store(e + i, v_add(v_load(te + i), v_load(pe + i)));
        } else {
            memset(e, 0, sizeof(float) * D);
        }
        rr0[p] = mean_sq(D, e);
    }
    rms_scales(rr0, Pp);
    for (int p = 0; p < Pp; p++) rr1[p] = rms_apply(D, x0 + p * D, rr0[p], x0 + p * D);
    rms_scales(rr1, Pp);
    for (int p = 0; p < Pp; p++) (void)rms_apply(D, x0 + p * D, rr1[p], n1 + p * D);
    NN(Pp, 3 * D, D, n1, D, s->wqkv_t, 3 * D, s->pk_qkv_t, qkv, 3 * D, NULL, 0, EPI_NONE);
    memset(o + P * D, 0, sizeof(float) * (size_t)(Pp - P) * D);
    for (int b = blk->seq0, r = 0; b < blk->seq1; r += lengths[b] - 1, b++)
        attn_fwd(D, N_HEADS, qkv + r * 3 * D, o + r * D, att + r * N_HEADS * ATT_ROW, lengths[b] - 1);
    NN(Pp, D, D, o, D, s->wo_t, D, s->pk_o_t, x1, D, x0, D, EPI_ADD);
    for (int p = 0; p < Pp; p++) rr2[p] = mean_sq(D, x1 + p * D);
    rms_scales(rr2, Pp);
    for (int p = 0; p < Pp; p++) (void)rms_apply(D, x1 + p * D, rr2[p], n2 + p * D);
    NN(Pp, F, D, n2, D, s->wf1_t, F, s->pk_f1_t, hid, F, NULL, 0, EPI_RELU);
    NN(Pp, D, F, hid, F, s->wf2_t, D, s->pk_f2_t, x2, D, x1, D, EPI_ADD);
    NN(Pp, LOGIT_LD, D, x2, D, s->wlm_t, LOGIT_LD, s->pk_lm_t, logits, LOGIT_LD, NULL, 0, EPI_NONE);

    /* Cross-entropy; the logits rows become dloss/dlogits = (softmax - onehot) / P_total in place. */
    const double loss = xent_rows(logits, LOGIT_LD, EMG_VOCAB, row_tgt, P, inv_p);
    if (grads == NULL) return loss;
    memset(logits + P * LOGIT_LD, 0, sizeof(float) * (size_t)(Pp - P) * LOGIT_LD);
    float *dx2 = s->dx2 + r0 * D, *dhid = s->dhid + r0 * F, *dn2 = s->dn2 + r0 * D, *dx1 = s->dx1 + r0 * D;
    float *dout = s->dout + r0 * D, *dqkv = s->dqkv + r0 * 3 * D, *dn1 = s->dn1 + r0 * D;

    const float *wqkv = tok_emb + EMG_OFF_WQ(D), *wo = tok_emb + EMG_OFF_WO(D);
    const float *wf1 = tok_emb + EMG_OFF_WF1(D), *wf2 = tok_emb + EMG_OFF_WF2(D), *wlm = tok_emb + EMG_OFF_WLM(D);
#ifdef EMG_BF16
    (void)wqkv, (void)wo, (void)wf1, (void)wf2, (void)wlm; /* its GEMMs read the packed copies (NN's pk) */
#endif
    float *g_tok = grads, *g_pos = grads + EMG_OFF_POS_EMB(D), *g_qkv = grads + EMG_OFF_WQ(D);
    float *g_wo = grads + EMG_OFF_WO(D), *g_f1 = grads + EMG_OFF_WF1(D), *g_f2 = grads + EMG_OFF_WF2(D);
    float *g_lm = grads + EMG_OFF_WLM(D);

    /* LM head */
    NN(Pp, D, EMG_VOCAB, logits, LOGIT_LD, wlm, D, s->pk_lm, dx2, D, NULL, 0, EPI_NONE);
    TN(EMG_VOCAB, D, P, logits, LOGIT_LD, x2, D, g_lm, D, accumulate);
    /* FFN */
    NN(Pp, F, D, dx2, D, wf2, F, s->pk_f2, dhid, F, hid, F, EPI_MASK);
    TN(D, F, P, dx2, D, hid, F, g_f2, F, accumulate);
    NN(Pp, D, F, dhid, F, wf1, D, s->pk_f1, dn2, D, NULL, 0, EPI_NONE);
    TN(F, D, P, dhid, F, n2, D, g_f1, D, accumulate);
    for (int p = 0; p < Pp; p++) rms_bwd(D, dn2 + p * D, n2 + p * D, rr2[p], dx2 + p * D, dx1 + p * D);
    /* attention output projection and attention */
    NN(Pp, D, D, dx1, D, wo, D, s->pk_o, dout, D, NULL, 0, EPI_NONE);
    TN(D, D, P, dx1, D, o, D, g_wo, D, accumulate);
    memset(dqkv + P * 3 * D, 0, sizeof(float) * (size_t)(Pp - P) * 3 * D);
    for (int b = blk->seq0, r = 0; b < blk->seq1; r += lengths[b] - 1, b++)
        attn_bwd(D, N_HEADS, qkv + r * 3 * D, att + r * N_HEADS * ATT_ROW, dout + r * D, dqkv + r * 3 * D,
                 lengths[b] - 1);
    /* Q, K, V projections (one GEMM each way: Wq, Wk, Wv are adjacent in the parameter layout) */
    NN(Pp, D, 3 * D, dqkv, 3 * D, wqkv, D, s->pk_qkv, dn1, D, NULL, 0, EPI_NONE);
    TN(3 * D, D, P, dqkv, 3 * D, n1, D, g_qkv, D, accumulate);
    /* the two norms and the embedding scatter */
    if (!accumulate) memset(g_tok, 0, sizeof(float) * (EMG_VOCAB + EMG_MAX_SEQ) * D);
    for (int p = 0; p < P; p++) {
        float dx0[D], de[D];
        rms_bwd(D, dn1 + p * D, n1 + p * D, rr1[p], dx1 + p * D, dx0);
        rms_bwd(D, dx0, x0 + p * D, rr0[p], NULL, de);
        float *gt = g_tok + row_tok[p] * D, *gp = g_pos + row_pos[p] * D;
        for (int i = 0; i < D; i += VW) {
            vf d = v_load(de + i);
            v_store(gt + i, v_add(v_load(gt + i), d));
            v_store(gp + i, v_add(v_load(gp + i), d));
        }
    }
    return loss;
}

/* A chunk's sequences in blocks of at most BLOCK_ROWS live rows (one whole sequence at least), each block's
 * activations reusing the chunk's first rows: a big batch then works in a cache-sized region instead of
 * streaming every activation of the batch through each operation (batch 256 was ~15% slower per sample than
 * batch 64 at d64/d128). Blocks add their weight gradients to the first block's; the loss sum goes to *total. */
static void FN(chunk_step)(struct emg_session *s, const struct emg_chunk *c, const uint8_t *lengths, float inv_p,
                           double *total, float *grads) {
    double sum = 0.0;
    for (int b = c->seq0, done = 0; b < c->seq1;) {
        struct emg_chunk blk = {.seq0 = b, .row0 = c->row0, .rows = lengths[b] - 1};
        for (b++; b < c->seq1 && blk.rows + lengths[b] - 1 <= BLOCK_ROWS; b++) blk.rows += lengths[b] - 1;
        blk.seq1 = b;
        sum += FN(block_step)(s, &blk, c->row0 + done, lengths, inv_p, grads, done > 0);
        done += blk.rows;
    }
    *total = sum;
}

/* One participant of a step: its chunk, then (once every chunk is done) its share of the fixed-order
 * gradient sum and, when training, of Adam and of the transposed copies. */
static void FN(step_part)(void *ctx, int tid, int n) {
    struct emg_step_job *job = ctx;
    struct emg_session *s = job->s;
    const struct emg_chunk *c = &s->chunks[tid];
    float *grads = emg_x86_chunk_grads(s, tid, job->grads);
    job->totals[tid] = 0.0;
    if (c->seq1 > c->seq0) FN(chunk_step)(s, c, job->lengths, job->inv_p, &job->totals[tid], grads);
    if (job->grads == NULL) return;
    if (emg_x86_reduce(job, tid, n) && job->train) FN(sync_part)(s, tid, n);
}

/* Pack, then run every participant's part of the step; returns the mean loss. */
static float FN(run_step)(struct emg_step_job *job, int batch, const uint8_t *tokens) {
    const int chunks = emg_x86_chunks(job->s, batch);
    emg_x86_job_participants(job, chunks);
    const int P = emg_x86_pack(job->s, batch, tokens, job->lengths, chunks);
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

static const struct emg_kernel FN(kernel) = {D_MODEL, N_HEADS, FN(loss_and_grad), FN(train_step),
                                             FN(sync_transposed)};

#undef D
#undef F
#undef FN
#undef NN
#undef TN
