"""`prewarm bench load` and `python -m bench.load`: parse the options, run, print."""

from __future__ import annotations

import argparse
import json
import os
import sys

from bench.term import sigterm_unwinds
from prewarm import arg_types

from .report import fmt_report
from .run import run_bench

# smaller, a run times the calls around the bytes (and the 11 tensors' headers), not the load
_model_size = arg_types.size_at_least(1 << 20)


def _folder(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder (the temporary model is written in it)")
    return text


def _device(text: str) -> str:
    import torch

    try:
        torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device (e.g. cpu, cuda:0)") from None
    return text


def cmd_bench_load(args: argparse.Namespace) -> int:
    log = (lambda m: print(m, file=sys.stderr)) if not args.json else (lambda _m: None)
    with sigterm_unwinds():  # a SIGTERM removes the temporary model too (bench/term.py)
        r = run_bench(
            args.size,
            args.runs,
            threads=args.threads,
            chunk_bytes=args.chunk,
            directory=args.dir,
            cold=not args.no_cold,
            device=args.device,
            idle_seconds=args.idle,
            log=log,
        )
    print(json.dumps(r, sort_keys=True) if args.json else fmt_report(r))
    return 0


def add_load_parser(group: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = group.add_parser("load", help="loader throughput vs raw read and safetensors.load_file")
    p.add_argument("--size", type=_model_size, default=1 << 30,
                   help="model size, e.g. 1GiB (default; at least 1MiB)")
    p.add_argument("--runs", type=arg_types.whole_at_least(1), default=5,
                   help="runs per contender; medians are reported")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--threads", type=arg_types.whole_at_least(1), default=None,
                   help="loader threads (default: the loader's)")
    p.add_argument("--chunk", type=arg_types.size_at_least(1), default=None, help="loader chunk size (default 8MiB)")
    p.add_argument("--dir", type=_folder, default=None,
                   help="where to write the temporary model (default: $TMPDIR)")
    p.add_argument("--device", type=_device, default=None,
                   help="target device (default cuda:0 if present, else cpu)")
    p.add_argument("--no-cold", action="store_true", help="skip the out-of-page-cache runs")
    p.add_argument("--idle", type=arg_types.non_negative, default=3.0,
                   help="seconds idle before each of the after-idle loads (0: skip them; default 3)")
    p.set_defaults(func=cmd_bench_load)
    return p


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench load` (sharing the `bench` group with any other registrar)."""
    from prewarm.commands import subgroup

    add_load_parser(subgroup(subparsers, "bench", "benchmarks"))


def main(argv: list[str] | None = None) -> int:
    from prewarm.commands import standalone_main

    return standalone_main("python -m bench.load", add_load_parser, argv)

