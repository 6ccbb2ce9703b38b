"""A training run: the config schema and its precedence, the memory estimate, run directories and
checkpoints, the training loop (divergence, Ctrl-C, progress, target loss, contention), and `runs`, the one
lifecycle (resolve, check, create or resume, claim, train, release) that the CLI, the API and sweeps share.

May import: base, model, data, backends.
"""
