"""`%train_options NAME`: a training-options form bound to a notebook variable."""

from __future__ import annotations

from typing import Any

from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, magics_class

from nbscale.errors import OptionsError
from nbscale.magics.arguments import argument, line_magic, magic_arguments, parse_line


@magics_class
class FormMagics(Magics):
    """Forms that edit training options."""

    shell: InteractiveShell  # registered with the kernel's shell (Magics allows None)

    @magic_arguments()
    @argument("name", metavar="NAME", help="the notebook variable that holds the TrainingOptions")
    @line_magic
    def train_options(self, line: str) -> Any:
        """Show a form of every training option bound to the notebook variable NAME.

        NAME starts from its TrainingOptions (or an options form's) when it has one, else from the defaults, and
        holds the form's TrainingOptions after every valid edit: use it with `%%train --options NAME`.
        Returns the form (`form = %train_options opts`); it is shown once either way.
        Python equivalent: `nbscale.options_form(NAME, bind_to="NAME")`.
        """
        args = parse_line(self.train_options, line)
        if not args.name.isidentifier():
            raise OptionsError(f"%train_options {args.name}: NAME must be a Python variable name.")
        from nbscale.training.options import TrainingOptions, unwrap_form
        from nbscale.ui.options_form import options_form

        current = unwrap_form(self.shell.user_ns.get(args.name))
        return options_form(current if isinstance(current, TrainingOptions) else None, bind_to=args.name)
