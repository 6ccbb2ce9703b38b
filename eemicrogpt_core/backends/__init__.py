"""How the core finds, checks and drives a backend: the `BackendSpec` a plugin yields and the session it
opens, the pluggy hook spec, plugin discovery and selection (`auto`, by name), the cffi loader for native
libraries, the checks on what a backend is given and returns, and the machine facts (CPU features, cores,
threads) backends and the trainer share.

May import: base, model, data.
"""
