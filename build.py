#!/usr/bin/env python3
"""gemma4-inf2 from a checkout: `python build.py COMMAND ...` runs the command line of gemma4_port/cli.py
(installed from the wheel, the same is `gemma4-inf2 COMMAND ...`)."""

import sys

from gemma4_port.cli import main

if __name__ == "__main__":
    sys.exit(main())
