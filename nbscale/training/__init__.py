"""Training (trainNetwork): options, the loop, checkpoints, and the pool path.

Users call the function `nbscale.train` (nbscale.notebook.train, which adds the displays to
nbscale.training.trainer.train); this package is what it runs.
"""
