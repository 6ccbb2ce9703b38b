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

static void FN(sync_transposed)(struct emg_session *s) {
    const float *p = s->core.params;
    const float *wqkv = p + EMG_OFF_WQ(D), *wo = p + EMG_OFF_WO(D), *wf1 = p + EMG_OFF_WF1(D);
    const float *wf2 = p + EMG_OFF_WF2(D), *wlm = p + EMG_OFF_WLM(D);
    transpose(wqkv, 3 * D, D, D, s->wqkv_t, 3 * D);
    transpose(wo, D, D, D, s->wo_t, D);
    transpose(wf1, F, D, D, s->wf1_t, F);
    transpose(wf2, D, F, F, s->wf2_t, D);
    transpose(wlm, EMG_VOCAB, D, D, s->wlm_t, LOGIT_LD); /* columns VOCAB..31 of wlm_t stay zero */
}

static void FN(loss_and_grad)(struct emg_session *s, int batch, const uint8_t *tokens, const uint8_t *lengths,
                              float *loss_out, float *grads) {
    /* Pack the live positions: row p is (sequence b, position t) for t <= lengths[b] - 2. */
    int P = 0;
    for (int b = 0; b < batch; b++) {
        s->seq_start[b] = P;
        const uint8_t *tk = tokens + b * EMG_MAX_SEQ;
        for (int t = 0; t + 1 < lengths[b]; t++, P++) {
            s->row_tok[P] = tk[t];
            s->row_tgt[P] = tk[t + 1];
            s->row_pos[P] = t;
        }
    }
    s->seq_start[batch] = P;
    const int Pp = (P + ROW_PAD - 1) / ROW_PAD * ROW_PAD;
    const float *tok_emb = s->core.params, *pos_emb = tok_emb + EMG_OFF_POS_EMB(D);

    /* Embedding and the two norms; padding rows are zero all the way through the step. */
    for (int p = 0; p < Pp; p++) {
        float e[D];
        if (p < P) {
            const float *te = tok_emb + s->row_tok[p] * D, *pe = pos_emb + s->row_pos[p] * D;
            for (int i = 0; i < D; i += VW) v_store(e + i, v_add(v_load(te + i), v_load(pe + i)));
        } else {
            memset(e, 0, sizeof e);
        }
        s->r0[p] = rms_fwd(D, e, s->x0 + p * D);
        s->r1[p] = rms_fwd(D, s->x0 + p * D, s->n1 + p * D);
    }
    gemm_nn(Pp, 3 * D, D, s->n1, D, s->wqkv_t, 3 * D, s->qkv, 3 * D, NULL, 0, EPI_NONE);
    memset(s->o + P * D, 0, sizeof(float) * (size_t)(Pp - P) * D);
    for (int b = 0; b < batch; b++) {
        const int r = s->seq_start[b], L = s->seq_start[b + 1] - r;
        attn_fwd(D, N_HEADS, s->qkv + r * 3 * D, s->o + r * D, s->att + r * N_HEADS * ATT_ROW, L);
    }
    gemm_nn(Pp, D, D, s->o, D, s->wo_t, D, s->x1, D, s->x0, D, EPI_ADD);
    for (int p = 0; p < Pp; p++) s->r2[p] = rms_fwd(D, s->x1 + p * D, s->n2 + p * D);
    gemm_nn(Pp, F, D, s->n2, D, s->wf1_t, F, s->hid, F, NULL, 0, EPI_RELU);
    gemm_nn(Pp, D, F, s->hid, F, s->wf2_t, D, s->x2, D, s->x1, D, EPI_ADD);
    gemm_nn(Pp, LOGIT_LD, D, s->x2, D, s->wlm_t, LOGIT_LD, s->logits, LOGIT_LD, NULL, 0, EPI_NONE);

    /* Cross-entropy; the logits rows become dloss/dlogits = (softmax - onehot) / P in place. */
    double total = 0.0;
    const float inv_p = 1.0f / (float)P;
    for (int p = 0; p < P; p++) {
        float *row = s->logits + p * LOGIT_LD;
        const float target_logit = row[s->row_tgt[p]];
        total += (double)(softmax_row(row, EMG_VOCAB, LOGIT_LD) - target_logit);
        row[s->row_tgt[p]] -= 1.0f;
        for (int i = 0; i < LOGIT_LD; i += VW) v_store(row + i, v_mul(v_load(row + i), v_set1(inv_p)));
    }
    *loss_out = (float)(total / P);
    if (grads == NULL) return;
    memset(s->logits + P * LOGIT_LD, 0, sizeof(float) * (size_t)(Pp - P) * LOGIT_LD);

    const float *wqkv = tok_emb + EMG_OFF_WQ(D), *wo = tok_emb + EMG_OFF_WO(D);
    const float *wf1 = tok_emb + EMG_OFF_WF1(D), *wf2 = tok_emb + EMG_OFF_WF2(D), *wlm = tok_emb + EMG_OFF_WLM(D);
    float *g_tok = grads, *g_pos = grads + EMG_OFF_POS_EMB(D), *g_qkv = grads + EMG_OFF_WQ(D);
    float *g_wo = grads + EMG_OFF_WO(D), *g_f1 = grads + EMG_OFF_WF1(D), *g_f2 = grads + EMG_OFF_WF2(D);
    float *g_lm = grads + EMG_OFF_WLM(D);

    /* LM head */
    gemm_nn(Pp, D, EMG_VOCAB, s->logits, LOGIT_LD, wlm, D, s->dx2, D, NULL, 0, EPI_NONE);
    gemm_tn(EMG_VOCAB, D, P, s->logits, LOGIT_LD, s->x2, D, g_lm, D);
    /* FFN */
    gemm_nn(Pp, F, D, s->dx2, D, wf2, F, s->dhid, F, s->hid, F, EPI_MASK);
    gemm_tn(D, F, P, s->dx2, D, s->hid, F, g_f2, F);
    gemm_nn(Pp, D, F, s->dhid, F, wf1, D, s->dn2, D, NULL, 0, EPI_NONE);
    gemm_tn(F, D, P, s->dhid, F, s->n2, D, g_f1, D);
    for (int p = 0; p < Pp; p++) rms_bwd(D, s->dn2 + p * D, s->n2 + p * D, s->r2[p], s->dx2 + p * D, s->dx1 + p * D);
    /* attention output projection and attention */
    gemm_nn(Pp, D, D, s->dx1, D, wo, D, s->dout, D, NULL, 0, EPI_NONE);
    gemm_tn(D, D, P, s->dx1, D, s->o, D, g_wo, D);
    memset(s->dqkv + P * 3 * D, 0, sizeof(float) * (size_t)(Pp - P) * 3 * D);
    for (int b = 0; b < batch; b++) {
        const int r = s->seq_start[b], L = s->seq_start[b + 1] - r;
        attn_bwd(D, N_HEADS, s->qkv + r * 3 * D, s->att + r * N_HEADS * ATT_ROW, s->dout + r * D,
                 s->dqkv + r * 3 * D, L);
    }
    /* Q, K, V projections (one GEMM each way: Wq, Wk, Wv are adjacent in the parameter layout) */
    gemm_nn(Pp, D, 3 * D, s->dqkv, 3 * D, wqkv, D, s->dn1, D, NULL, 0, EPI_NONE);
    gemm_tn(3 * D, D, P, s->dqkv, 3 * D, s->n1, D, g_qkv, D);
    /* the two norms and the embedding scatter */
    memset(g_tok, 0, sizeof(float) * (EMG_VOCAB + EMG_MAX_SEQ) * D);
    for (int p = 0; p < P; p++) {
        float dx0[D], de[D];
        rms_bwd(D, s->dn1 + p * D, s->n1 + p * D, s->r1[p], s->dx1 + p * D, dx0);
        rms_bwd(D, dx0, s->x0 + p * D, s->r0[p], NULL, de);
        float *gt = g_tok + s->row_tok[p] * D, *gp = g_pos + s->row_pos[p] * D;
        for (int i = 0; i < D; i += VW) {
            vf d = v_load(de + i);
            v_store(gt + i, v_add(v_load(gt + i), d));
            v_store(gp + i, v_add(v_load(gp + i), d));
        }
    }
}

static const struct emg_kernel FN(kernel) = {D_MODEL, N_HEADS, FN(loss_and_grad), FN(sync_transposed)};

#undef D
#undef F
#undef FN
