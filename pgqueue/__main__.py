"""`python -m pgqueue` is the `pgqueue` command."""

import sys

from pgqueue.cli import main

# Guarded: tools that import every module of the package (the API reference's builder) must
# not run the command with their own arguments.
if __name__ == "__main__":
    sys.exit(main())
