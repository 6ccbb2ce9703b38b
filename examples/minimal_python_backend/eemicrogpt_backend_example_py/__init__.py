"""example_py: a minimal third-party eemicrogpt backend in Python (numpy)."""
