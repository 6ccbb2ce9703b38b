"""eemicrogpt SME2 backend sme2_f32 (fp32 FMOPA into za32 tiles)."""
