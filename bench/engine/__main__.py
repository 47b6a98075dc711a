import sys

from .cli import main

sys.exit(main(["engine", *sys.argv[1:]]))
