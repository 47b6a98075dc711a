import sys

from .cli import main

sys.exit(main(["failover", *sys.argv[1:]]))
