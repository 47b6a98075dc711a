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
    "prewarm.ops_cli",  # models list, fleet, preload, evict, pin, unpin, events
    "gpu_worker.cli",  # worker, models demo
    "bench.load.cli",  # bench load
    "bench.live.cli",  # bench live
    "scheduler.cli",  # scheduler
    "web.cli",  # web
    "prewarm.up",  # up, replay
    "simulator.cli",  # simulate
    "prewarm.engines_cli",  # engines, engines install
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
        from prewarm.runtime import redis_failure

        line = redis_failure(exc)  # Redis down or the password refused: one line, not a traceback
        if line is None:
            raise
        print(f"prewarm: {line}", file=sys.stderr)
        return 2


def subgroup(sub: argparse._SubParsersAction, name: str, help_text: str) -> argparse._SubParsersAction:
    """The nested subcommand group `name` (e.g. `models`), created once and shared by registrars."""
    existing = sub.choices.get(name)
    if existing is None:
        existing = sub.add_parser(name, help=help_text)
        existing.set_defaults(func=lambda _a, p=existing: (p.print_help(), 2)[1])
        existing._prewarm_sub = existing.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND")
    return existing._prewarm_sub  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
