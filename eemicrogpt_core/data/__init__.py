"""Training data: reading a user's file as a bounded stream, turning it into token sequences, the seeded
train/validation split and batch sampler, and locating (or downloading once) the default names file.

May import: base, model.
"""
