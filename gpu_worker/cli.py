"""Worker subcommands: `prewarm worker` and `prewarm models demo`. Nothing here imports torch at import time."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_worker(args: argparse.Namespace) -> int:
    from gpu_worker.main import run_worker

    return run_worker(threads=args.threads, loglevel=args.loglevel)


def cmd_models_demo(args: argparse.Namespace) -> int:
    from gpu_worker.demo_models import write_demo

    out = Path(args.out)
    catalog = write_demo(out, small=args.small, force=args.force,
                         log=None if args.quiet else (lambda m: print(m, file=sys.stderr)))
    print(catalog)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from prewarm.commands import subgroup

    p = sub.add_parser("worker", help="run a GPU worker for the devices in PREWARM_DEVICES")
    p.add_argument("--threads", type=int, help="task threads (default PREWARM_WORKER_THREADS, else 4 per GPU, "
                                               "at least 8)")
    p.add_argument("--loglevel", default="INFO")
    p.set_defaults(func=cmd_worker)

    models = subgroup(sub, "models", "the model catalog")
    p = models.add_parser("demo", help="write the demo models (seeded random weights) and their catalog")
    p.add_argument("--out", required=True, help="folder to write into (catalog.toml and the weights)")
    p.add_argument("--small", action="store_true", help="tiny models (a few MB in all), for tests")
    p.add_argument("--force", action="store_true", help="rewrite even when the folder is up to date")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_models_demo)
