"""Worker subcommands: `prewarm worker` and `prewarm models demo`. Nothing here imports torch at import time."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prewarm import arg_types


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


def cmd_probe(args: argparse.Namespace) -> int:
    from gpu_worker import health
    from prewarm.config import Settings

    settings = Settings.from_env()
    path = health.path_for(settings.data_dir, settings.node)
    problem = health.check(path, args.what)
    if problem is not None:
        print(f"prewarm probe {args.what}: {problem}", file=sys.stderr)
        return 1
    print(f"prewarm probe {args.what}: ok")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from prewarm.commands import subgroup

    p = sub.add_parser("worker", help="run a GPU worker for the devices in PREWARM_DEVICES")
    p.add_argument("--threads", type=arg_types.whole_at_least(1), help="task threads (default PREWARM_WORKER_THREADS, else 4 per GPU, "
                                               "at least 8)")
    p.add_argument("--loglevel", default="INFO")
    p.set_defaults(func=cmd_worker)

    probe = subgroup(sub, "probe", "the worker's health on this host, for exec probes (reads a local file, "
                                   "never Redis)")
    for what, text in (("live", "exit 0 while the worker's heartbeat thread beats (a Redis outage keeps it live)"),
                       ("ready", "exit 0 once the worker's consumer is connected and its last heartbeat reached "
                                 "Redis within PREWARM_HEARTBEAT_TTL")):
        p = probe.add_parser(what, help=text, description=text + ". The worker is the one of PREWARM_NODE "
                             "whose data folder is PREWARM_DATA_DIR, as `prewarm worker` was started.")
        p.set_defaults(func=cmd_probe, what=what)

    models = subgroup(sub, "models", "the model catalog")
    p = models.add_parser("demo", help="write the demo models (seeded random weights) and their catalog")
    p.add_argument("--out", required=True, type=arg_types.output_folder, help="folder to write into (catalog.toml and the weights)")
    p.add_argument("--small", action="store_true", help="tiny models (a few MB in all), for tests")
    p.add_argument("--force", action="store_true", help="rewrite even when the folder is up to date")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_models_demo)
