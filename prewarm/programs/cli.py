"""prewarm: keeps ML inference fleets out of cold starts by warming models before demand arrives.

One command line for every part: each part registers its own subcommands.

Registration modules must not import torch at import time: `prewarm fleet` or `prewarm web` should start
fast and never need it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules exposing `register(subparsers)`; each adds its subcommands with set_defaults(func=...).
_REGISTRARS = (
    "prewarm.programs.ops",  # models list, fleet, preload, evict, pin, unpin, events
    "gpu_worker.cli",  # worker, models demo
    "bench.load.cli",  # bench load
    "bench.tick.cli",  # bench tick
    "bench.engine.cli",  # bench engine
    "bench.router.cli",  # bench router
    "bench.live.cli",  # bench live
    "bench.failover.cli",  # bench failover
    "scheduler.cli",  # scheduler
    "web.cli",  # web
    "prewarm.programs.up",  # up, replay
    "simulator.cli",  # simulate
    "prewarm.programs.engines",  # engines, engines install
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prewarm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser._prewarm_sub = sub  # type: ignore[attr-defined]  # registrars find sibling groups through it
    for name in _REGISTRARS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a registrar's own dependency is missing: a real error
                raise
            continue  # that part is not installed in this tree
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from prewarm.config_errors import ConfigError
        from prewarm.runtime import redis_failure

        # a PREWARM_* variable (its name and what to write), Redis down or the password refused: one line
        line = str(exc) if isinstance(exc, ConfigError) else redis_failure(exc)
        if line is None:
            raise
        print(f"prewarm: {line}", file=sys.stderr)
        return 2




if __name__ == "__main__":
    sys.exit(main())
