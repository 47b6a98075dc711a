"""`python -m simulator simulate TRACE ...` until prewarm's CLI wires in `simulator.cli.register`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] if sys.argv[1:2] == ["simulate"] else ["simulate", *sys.argv[1:]]))
