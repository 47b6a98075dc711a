"""`prewarm up`: the whole system on one machine, from one command.

It starts (or reuses) the Redis, generates the demo models once, then runs the Procfile's processes
(web, scheduler, worker) under honcho, plus a traffic player replaying the bundled Azure trace through
the hooks so models are seen warming ahead of demand and being evicted when they go quiet. It prints the
console's URL and login. Ctrl-C stops every process it started, the embedded Redis included.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

from prewarm.config import Settings, repo_root


def _procfile(path: Path) -> dict[str, str]:
    from honcho.environ import parse_procfile

    return dict(parse_procfile(path.read_text()).processes)


def cmd_up(args: argparse.Namespace) -> int:
    from honcho.manager import Manager

    from prewarm import runtime

    settings = Settings.from_env()
    env = dict(os.environ)
    url = runtime.redis_url(settings)  # starts the embedded Redis when none is configured
    env["PREWARM_REDIS_URL"] = url
    try:
        if not os.environ.get("PREWARM_CATALOG"):
            catalog = settings.data_dir / "demo-models" / "catalog.toml"
            if not catalog.exists():
                print(f"prewarm: generating the demo models in {catalog.parent} (once)", flush=True)
                subprocess.run([sys.executable, "-m", "prewarm.programs.cli", "models", "demo", "--out",
                                str(catalog.parent)], check=True)
            env["PREWARM_CATALOG"] = str(catalog)
        env.setdefault("PREWARM_DEVICES", args.devices)
        env.setdefault("PREWARM_NODE", "node-a")
        token = env.get("PREWARM_ADMIN_TOKEN") or secrets.token_urlsafe(12)
        env["PREWARM_ADMIN_TOKEN"] = token
        port = str(args.port or settings.port)
        env["PORT"] = port
        env["PYTHONUNBUFFERED"] = "1"
        metrics_dir = settings.data_dir / "prometheus-multiproc"
        metrics_dir.mkdir(parents=True, exist_ok=True)
        for f in metrics_dir.glob("*.db"):
            f.unlink()  # multiprocess metric files from an earlier run would be summed in
        env.setdefault("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"

        manager = Manager()
        for name, cmd in _procfile(repo_root() / "Procfile").items():
            manager.add_process(name, cmd, env=env, cwd=str(repo_root()))
        if not args.no_traffic:
            replay = [sys.executable, "-m", "prewarm.programs.cli", "replay", "--url", f"http://127.0.0.1:{port}",
                      "--speed", str(args.speed), "--rate", str(args.rate), "--loop"]
            if args.trace:
                replay.insert(4, args.trace)
            manager.add_process("traffic", shlex.join(replay), env=env, cwd=str(repo_root()))
        print(f"\n  prewarm console: http://127.0.0.1:{port}/   login token: {token}\n"
              f"  metrics: http://127.0.0.1:{port}/metrics   Redis: {url}\n  Ctrl-C stops everything.\n",
              flush=True)
        manager.loop()
        return manager.returncode or 0
    finally:
        runtime.stop_owned()


def register(sub: argparse._SubParsersAction) -> None:
    from prewarm.programs import replay

    p = sub.add_parser("up", help="run the whole system here: Redis, web, scheduler, worker, demo traffic")
    p.add_argument("--port", type=int, help="web port (default PORT or 8000)")
    # Two CPU virtual GPUs that together hold a little less than the demo catalog (3.1 GB): the
    # scheduler has to choose, so the console shows evictions as well as preloads.
    p.add_argument("--devices", default="cpu:0=1536MiB,cpu:1=1536MiB", help="worker devices (PREWARM_DEVICES wins)")
    p.add_argument("--speed", type=float, default=60.0, help="trace seconds per real second")
    p.add_argument("--rate", type=float, default=3.0, help="approximate demo requests per real second")
    p.add_argument("--trace", help="trace to replay (default: the bundled Azure sample)")
    p.add_argument("--no-traffic", action="store_true", help="do not start the traffic player")
    p.set_defaults(func=cmd_up)
    replay.register(sub)
