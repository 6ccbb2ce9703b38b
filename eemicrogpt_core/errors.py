"""User-facing errors: the CLI prints these as one line (no traceback) and exits non-zero."""


class EemicrogptError(Exception):
    """Base of every error caused by the user's input or environment rather than a bug."""


class ConfigError(EemicrogptError):
    """A config file or flag is malformed, unknown or impossible."""


class DataError(EemicrogptError):
    """The names file is missing, unreadable or malformed."""


class CheckpointError(EemicrogptError):
    """A run directory or checkpoint cannot be read or does not match."""


class BackendSelectionError(EemicrogptError):
    """The requested backend is unknown, unavailable here, or cannot run this configuration."""


class BatchError(EemicrogptError, ValueError):
    """Arrays handed to a backend have the wrong dtype, shape or values."""
