"""Which file holds a notebook cell's code, as IPython names it in tracebacks (IPython 7.34 to 9).

IPython 8+ maps the file a cell was compiled into to `Cell In[4]` (`shell.compile.format_code_name`); IPython
7.34 (Colab's) has no such map and shows the file's own name, after keeping the cell's lines in
`linecache._ipython_cache`.
"""

from __future__ import annotations

import linecache
import sys


def cell_label(filename: str) -> str | None:
    """'Cell In[4]' for the file IPython compiled notebook cell 4 into (under IPython 7 the file's name); None
    outside IPython or for any other file."""
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    if shell is None:
        return None
    format_code_name = getattr(getattr(shell, "compile", None), "format_code_name", None)
    if format_code_name is not None:
        named = format_code_name(filename)
        return " ".join(named) if named else None
    return filename if filename in getattr(linecache, "_ipython_cache", {}) else None
