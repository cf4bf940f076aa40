"""`%gpu` and `%gpu N`: parse the line, call nbscale.gpus() / nbscale.select_gpu()."""

from __future__ import annotations

from IPython.core.magic import Magics, magics_class
from IPython.display import display

from nbscale.gpu import gpus, select_gpu
from nbscale.magics.arguments import argument, line_magic, magic_arguments, parse_line


@magics_class
class GpuMagics(Magics):
    """The machine's GPUs (gpuDevice)."""

    @magic_arguments()
    @argument("index", nargs="?", type=int, help="make this GPU the notebook's CUDA device (see the table's index)")
    @line_magic
    def gpu(self, line: str) -> None:
        """Show every GPU (index, name, compute capability, memory, utilization, temperature, power, processes),
        or with an index, select the notebook's GPU."""
        args = parse_line(self.gpu, line)
        if args.index is None:
            display(gpus())  # shown wherever the line stands in its cell; nbscale.gpus() returns the table
            return None
        chosen = select_gpu(args.index)
        print(f"Selected GPU {chosen.index}: {chosen.name}.")
        return None
