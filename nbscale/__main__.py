"""`python -m nbscale ...`: the same command line as the `nbscale` script (nbscale.cli)."""

import sys

from nbscale.cli import main

sys.exit(main())
