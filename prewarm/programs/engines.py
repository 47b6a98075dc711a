"""`prewarm engines [--json]` lists the runtimes with availability and version;
`prewarm engines install vllm` installs an engine that runs in its own environment (idempotent)."""

from __future__ import annotations

import argparse
import json
import subprocess

from prewarm.engines import INSTALLABLE, all_engines, engine_status, install_script


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engines", help="runtimes that can host replicas: availability, version, install")
    p.add_argument("--json", action="store_true", help='print {"engines": [{"name", "available", "version", ...}]}')
    p.set_defaults(func=_list)
    inner = p.add_subparsers(dest="engines_command", metavar="SUBCOMMAND")
    inst = inner.add_parser("install", help="install an engine into its own environment (idempotent)")
    inst.add_argument("name", choices=sorted(INSTALLABLE))
    inst.set_defaults(func=_install)


def _list(args: argparse.Namespace) -> int:
    engines = all_engines()
    if args.json:
        print(json.dumps({"engines": [e.as_json() for e in engines]}, indent=2))
        return 0
    for e in engines:
        print(f"{e.name:<13} {'available' if e.available else 'missing':<10} {e.version or '-':<10} {e.detail}")
        print(f"{'':<13} host tier: {e.host_tier}")
    return 0


def _install(args: argparse.Namespace) -> int:
    rc = subprocess.call(["bash", str(install_script(args.name))])
    if rc != 0:
        print(f"prewarm engines install {args.name}: the install script failed (exit {rc}); see its output above")
        return rc
    e = engine_status(args.name)
    print(f"{e.name} {e.version} installed in {e.where}")
    return 0 if e.available else 1
