"""eemicrogpt SME2 backend sme2_f16: matmuls accumulated in fp16 by non-widening FMOPA (FEAT_SME_F16F16)."""
