"""Training (trainNetwork): options, the loop, checkpoints, and the pool path.

`nbscale.train` is both this package and the function users call: the root package makes this module callable
(forwarding to nbscale.notebook.train, which adds the displays to nbscale.train.trainer.train).
"""
