"""eemicrogpt's Python API: train a tiny character-level GPT, load a run, sample names, export weights.

    import eemicrogpt
    run = eemicrogpt.train(d_model=16, steps=300)       # the CLI's keys; data from $EEMICROGPT_DATA
    print(run.sample(5))
    run = eemicrogpt.load(run.run_dir)                   # any run directory `eemicrogpt train` wrote

Every error caused by input or environment is an `eemicrogpt.EemicrogptError` (a subclass says which
kind). docs/python-api.md documents it.
"""

from eemicrogpt_core._version import __version__
from eemicrogpt_core.base.errors import (
    BackendSelectionError,
    BatchError,
    CheckpointError,
    ConfigError,
    DataError,
    EemicrogptError,
    NonFiniteError,
    OutOfMemoryError,
    StorageError,
)
from eemicrogpt_core.interface.api import Run, load, train
from eemicrogpt_core.training.trainer import TrainingDiverged

__all__ = [
    "BackendSelectionError",
    "BatchError",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "EemicrogptError",
    "NonFiniteError",
    "OutOfMemoryError",
    "Run",
    "StorageError",
    "TrainingDiverged",
    "__version__",
    "load",
    "train",
]
