"""`%%train`: parse the line, call nbscale.notebook.train_cell (run the cell, then nbscale.train or sweep)."""

from __future__ import annotations

import types
from typing import Any

from IPython.core.magic import Magics, magics_class

from nbscale.errors import OptionsError
from nbscale.magics.arguments import argument, batch_size, cell_magic, magic_arguments, parse_line
from nbscale.notebook import CellTraining, train_cell


@magics_class
class TrainMagics(Magics):
    """Training from a cell (trainNetwork)."""

    @magic_arguments()
    @argument("--options", metavar="NAME", help="a notebook variable holding TrainingOptions or an options form")
    @argument(
        "-e",
        "--execution-environment",
        "--env",
        dest="env",
        type=str.lower,
        choices=["auto", "cpu", "gpu", "multi-gpu", "parallel"],
        help="execution_environment (--env: the same, as API.md spells it; %%pool and %%batch use --env for variables)",
    )
    @argument("--epochs", type=int, metavar="N", help="max_epochs")
    @argument("--batch-size", type=batch_size, metavar="B", help="mini_batch_size: a number, or auto (GPUs)")
    @argument("--lr", type=float, metavar="LR", help="initial_learn_rate")
    @argument("--solver", type=str.lower, choices=["sgdm", "adam", "adamw", "rmsprop"], help="the solver")
    @argument("--no-plots", action="store_true", help="no training-progress display")
    @argument("--quiet", action="store_true", help="no verbose table")
    @argument("--net", default="net", metavar="NAME", help="variable for the trained network (default: net)")
    @argument("--info", default="info", metavar="NAME", help="variable for the training info (default: info)")
    @argument(
        "--sweep",
        action="append",
        metavar='"FIELD=V1,V2"',
        help="train one network per value, each on its own pool worker; repeat for a grid (nbscale.sweep)",
    )
    @argument(
        "--seed", type=int, metavar="N", help="with --sweep: every run starts from this seed (nbscale.sweep's seed)"
    )
    @cell_magic
    def train(self, line: str, cell: str) -> None:
        """Run the cell in the notebook, then train its `model` on its `train_data` (and `val_data`).

        The cell must define `model` and `train_data`; it may define `val_data`, `loss_fn` and `step_fn`. Flags override
        the options; afterwards the network and the info are notebook variables (--net, --info).
        Python equivalent: `net, info = nbscale.train(model, train_data, options, loss_fn=loss_fn)`.
        """
        args = parse_line(self.train, line)
        request = CellTraining(
            options=args.options,
            environment=args.env,
            epochs=args.epochs,
            batch_size=args.batch_size,
            learn_rate=args.lr,
            solver=args.solver,
            plots=not args.no_plots,
            verbose=not args.quiet,
            net=args.net,
            info=args.info,
            sweep=tuple(args.sweep or ()),
            seed=args.seed,
        )
        _refuse_module_names(
            self.shell.user_ns if self.shell is not None else {}, (("--net", request.net), ("--info", request.info))
        )
        train_cell(self.shell, cell, request)


def _refuse_module_names(namespace: dict[str, Any], names: tuple[tuple[str, str], ...]) -> None:
    """OptionsError, before the cell runs, for a result name the notebook has bound to a module (`--net torch`):
    the trained network would replace the module, and every later `torch.` would fail."""
    for flag, name in names:
        if isinstance(namespace.get(name), types.ModuleType):
            raise OptionsError(
                f"{flag} {name}: {name!r} is the notebook's {namespace[name].__name__} module, which "
                f"the result would replace; pick another name, such as {flag} trained."
            )
