"""`python -m gemma4_port COMMAND ...`: the command line without a console script or a checkout."""

import sys

from gemma4_port.cli import main

if __name__ == "__main__":
    sys.exit(main())
