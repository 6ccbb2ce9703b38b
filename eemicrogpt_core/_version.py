"""The core's version: the one place it is written (pyproject.toml and every in-repo backend read it)."""

__version__ = "0.2.0"
