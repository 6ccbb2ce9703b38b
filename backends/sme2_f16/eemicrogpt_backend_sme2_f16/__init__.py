"""eemicrogpt SME2 backends with fp16 GEMM operands: sme2_f16 (non-widening fp16 FMOPA, FEAT_SME_F16F16,
fp16 accumulation) and sme2_f16w (widening fp16 FMOPA, fp32 accumulation, base SME)."""
