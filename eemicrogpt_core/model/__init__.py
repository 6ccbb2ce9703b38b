"""The model itself: its shape and flat parameter layout, the reference maths in numpy (forward, loss,
backward), Adam and the learning-rate schedule every backend reproduces, the vocabulary, and generation.

May import: base.
"""
