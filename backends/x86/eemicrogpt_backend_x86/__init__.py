"""eemicrogpt's native x86 backends: `avx512` and `avx2` (plain C libraries loaded with cffi)."""

__version__ = "0.1.0"
