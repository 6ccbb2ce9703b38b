"""`eemicrogpt sweep`: a spec expanded into runs, each an ordinary run directory trained through the
training part's lifecycle, dispatched to pinned local workers or Ray tasks, with results and summaries.

May import: base, model, data, backends, training.
"""
