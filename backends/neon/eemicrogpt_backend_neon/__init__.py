"""neon: the eemicrogpt training step in ARM Advanced SIMD C."""
