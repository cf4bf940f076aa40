"""`%%train`: run the cell (it defines model, train_data, maybe val_data and loss_fn), then nbscale.train."""

from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from nbscale.errors import NbscaleError, OptionsError

_CELL_NAMES = ("model", "train_data", "val_data", "loss_fn", "make_model")


def _assigned_names(shell: Any, cell: str) -> set[str]:
    """The names of _CELL_NAMES the cell's code binds in the notebook (`x = x`, `def loss_fn`, imports count;
    names bound inside functions and classes do not)."""
    from nbscale.pool.cellvars import names_bound

    try:
        return names_bound(shell.transform_cell(cell)) & set(_CELL_NAMES)
    except SyntaxError:
        return set()


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
        for flag, name in (("--net", args.net), ("--info", args.info)):
            if not name.isidentifier():
                raise OptionsError(f"{flag} {name}: the name for the result must be a Python identifier, such as "
                                   f"{flag} trained.")
        namespace = self.shell.user_ns
        before = {name: namespace[name] for name in _CELL_NAMES if name in namespace}
        outcome = self.shell.run_cell(cell)
        if not outcome.success:  # its traceback is shown above; the cell must still fail (Run All stops here)
            raise NbscaleError("The %%train cell raised the error above, so nothing was trained.")
        # only what this cell defined counts: a val_data or loss_fn left from an earlier cell must not leak in
        defined = _assigned_names(self.shell, cell) | {
            name for name in _CELL_NAMES if name in namespace and namespace[name] is not before.get(name)}
        del before  # the earlier values (an old network) are not kept alive through training
        cell_values = {name: namespace[name] for name in _CELL_NAMES if name in defined and name in namespace}
        sweeping = args.sweep and callable(cell_values.get("make_model"))
        needed = ("train_data",) if sweeping else ("model", "train_data")
        missing = [name for name in needed if name not in cell_values]
        if missing:
            earlier = [name for name in missing if name in namespace]
            plural = len(earlier) > 1
            note = (f" ({' and '.join(earlier)} from an earlier cell {'are' if plural else 'is'} not used: assign "
                    f"{'them' if plural else 'it'} in this cell)" if earlier else "")
            raise OptionsError(f"The %%train cell must define {' and '.join(missing)}{note}; it may define "
                               "val_data and loss_fn too.")
        options = self._options(args, cell_values)
        if args.sweep:
            self._sweep(args, cell_values, options)
            return
        from nbscale.train.trainer import train

        net, info = train(cell_values["model"], cell_values["train_data"], options, loss_fn=cell_values.get("loss_fn"))
        namespace[args.net], namespace[args.info] = net, info

    def _sweep(self, args: Any, cell_values: dict[str, Any], options: Any) -> None:
        """--sweep: one run per combination via nbscale.sweep; make_model() builds each network (else every run
        starts from a copy of the cell's `model`). --net/--info get the best run's; all in sweep_result."""
        from nbscale.train.sweep import parse_grid, sweep

        namespace = self.shell.user_ns
        make_model = cell_values.get("make_model")
        result = sweep(make_model if callable(make_model) else cell_values["model"], cell_values["train_data"],
                       options, parse_grid(args.sweep), loss_fn=cell_values.get("loss_fn"))
        namespace["sweep_result"] = result
        if result.best is not None:
            namespace[args.net], namespace[args.info] = result.best.net, result.best.info

    def _options(self, args: Any, cell_values: dict[str, Any]) -> Any:
        from nbscale.train.options import TrainingOptions

        namespace = self.shell.user_ns
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
        if cell_values.get("val_data") is not None:  # the cell's own val_data wins over the options'
            changes["validation_data"] = cell_values["val_data"]
        return base.replace(**changes) if changes else base
