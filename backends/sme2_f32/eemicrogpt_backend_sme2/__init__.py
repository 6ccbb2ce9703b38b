"""eemicrogpt SME2 backends: sme2_f32 (fp32 FMOPA into za32 tiles); shared probe and spec for sme2_f16."""
