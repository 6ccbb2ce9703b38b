"""The tools around training: `eemicrogpt bench`, charts of runs and sweeps (`plot`), and export to
safetensors and PyTorch.

May import: base, model, data, backends, training, sweep.
"""
