"""numpy_ref: the vectorised numpy reference backend of eemicrogpt (see step.py for the algorithm)."""

__version__ = "0.1.0"
