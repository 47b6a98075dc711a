import sys

from .cli import main

sys.exit(main(["tick", *sys.argv[1:]]))
