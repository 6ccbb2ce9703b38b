"""example_c: a minimal third-party eemicrogpt backend in portable C."""
