"""The one argparse helper every part's command registrar shares (the registrars live beside their parts;
the `prewarm` command that gathers them is prewarm.programs.cli)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def subgroup(sub: argparse._SubParsersAction, name: str, help_text: str) -> argparse._SubParsersAction:
    """The nested subcommand group `name` (e.g. `models`), created once and shared by registrars."""
    existing = sub.choices.get(name)
    if existing is None:
        existing = sub.add_parser(name, help=help_text)
        existing.set_defaults(func=lambda _a, p=existing: (p.print_help(), 2)[1])
        existing._prewarm_sub = existing.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND")
    return existing._prewarm_sub  # type: ignore[attr-defined]


def standalone_main(prog: str, add_parser: Callable[[argparse._SubParsersAction], object],
                    argv: list[str] | None = None) -> int:
    """`python -m <prog>`: the same subcommand a registrar adds under `prewarm`, in a parser of its own."""
    parser = argparse.ArgumentParser(prog=prog)
    add_parser(parser.add_subparsers(dest="command", metavar="COMMAND"))
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)
