"""The foundation every other part stands on: the user-error classes and their one-line wording, paths as the
user typed them, atomic file writes, numpy's BLAS held to one thread, and the native ABI's constants read
from include/eemicrogpt.h.

May import: nothing else of the core.
"""
