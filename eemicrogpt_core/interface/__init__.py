"""What users call: the `eemicrogpt` command (typer), its options derived from the config schema, the
version report, and the Python API (`train`, `load`, `Run`) that the `eemicrogpt` package re-exports.

May import: every other part of the core.
"""
