import sys

from .cli import main

sys.exit(main(["router", *sys.argv[1:]]))
