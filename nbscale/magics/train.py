"""`%%train`: run the cell (it defines model, train_data, maybe val_data and loss_fn), then nbscale.train."""

from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from nbscale.errors import OptionsError


@magics_class
class TrainMagics(Magics):
    """Training from a cell (trainNetwork)."""

    @magic_arguments()
    @argument("--options", metavar="NAME", help="a notebook variable holding TrainingOptions or an options form")
    @argument("--env", choices=["auto", "cpu", "gpu", "multi-gpu", "parallel"], help="execution_environment")
    @argument("--epochs", type=int, metavar="N", help="max_epochs")
    @argument("--batch-size", type=int, metavar="B", help="mini_batch_size")
    @argument("--lr", type=float, metavar="LR", help="initial_learn_rate")
    @argument("--solver", choices=["sgdm", "adam", "adamw", "rmsprop"], help="the solver")
    @argument("--no-plots", action="store_true", help="no training-progress display")
    @argument("--quiet", action="store_true", help="no verbose table")
    @argument("--net", default="net", metavar="NAME", help="variable for the trained network (default: net)")
    @argument("--info", default="info", metavar="NAME", help="variable for the training info (default: info)")
    @argument("--sweep", action="append", metavar='"FIELD=V1,V2"',
              help="train one network per value, each on its own pool worker; repeat for a grid (nbscale.sweep)")
    @cell_magic
    def train(self, line: str, cell: str) -> None:
        """Run the cell in the notebook, then train its `model` on its `train_data` (and `val_data`).

        The cell must define `model` and `train_data`; it may define `val_data` and `loss_fn`. Flags override
        the options; afterwards the network and the info are notebook variables (--net, --info).
        Python equivalent: `net, info = nbscale.train(model, train_data, options, loss_fn=loss_fn)`.
        """
        args = parse_argstring(self.train, line)
        outcome = self.shell.run_cell(cell)
        if not outcome.success:
            return
        namespace = self.shell.user_ns
        needed = ("train_data",) if args.sweep and callable(namespace.get("make_model")) else ("model", "train_data")
        missing = [name for name in needed if name not in namespace]
        if missing:
            raise OptionsError(f"The %%train cell must define {' and '.join(missing)} (and may define val_data "
                               "and loss_fn).")
        options = self._options(args, namespace)
        if args.sweep:
            self._sweep(args, namespace, options)
            return
        from nbscale.train.trainer import train

        net, info = train(namespace["model"], namespace["train_data"], options, loss_fn=namespace.get("loss_fn"))
        namespace[args.net], namespace[args.info] = net, info

    @staticmethod
    def _sweep(args: Any, namespace: dict[str, Any], options: Any) -> None:
        """--sweep: one run per combination via nbscale.sweep; the cell's make_model() builds each network
        (else every run starts from a copy of `model`). --net/--info get the best run's; all in sweep_result."""
        from nbscale.train.sweep import parse_grid, sweep

        make_model = namespace.get("make_model")
        result = sweep(make_model if callable(make_model) else namespace["model"], namespace["train_data"], options,
                       parse_grid(args.sweep), loss_fn=namespace.get("loss_fn"))
        namespace["sweep_result"] = result
        if result.best is not None:
            namespace[args.net], namespace[args.info] = result.best.net, result.best.info

    @staticmethod
    def _options(args: Any, namespace: dict[str, Any]) -> Any:
        from nbscale.train.options import TrainingOptions

        if args.options is not None:
            if args.options not in namespace:
                raise OptionsError(f"--options {args.options}: no notebook variable named {args.options!r}.")
            base = namespace[args.options]
            base = getattr(base, "options", base)  # an options form carries its TrainingOptions
            if not isinstance(base, TrainingOptions):
                raise OptionsError(f"--options {args.options}: {args.options} is a {type(base).__name__}, not "
                                   "TrainingOptions or an options form.")
        else:
            base = TrainingOptions(args.solver or "sgdm", plots="training-progress")
        changes: dict[str, Any] = {}
        for flag, field in (("env", "execution_environment"), ("epochs", "max_epochs"),
                            ("batch_size", "mini_batch_size"), ("lr", "initial_learn_rate"), ("solver", "solver")):
            if getattr(args, flag) is not None:
                changes[field] = getattr(args, flag)
        if args.no_plots:
            changes["plots"] = "none"
        if args.quiet:
            changes["verbose"] = False
        if namespace.get("val_data") is not None and base.validation_data is None:
            changes["validation_data"] = namespace["val_data"]
        return base.replace(**changes) if changes else base
