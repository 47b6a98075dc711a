"""`prewarm up`: the whole system on one machine, from one command.

It starts (or reuses) the Redis, generates the demo models once, then runs the Procfile's processes
(web, scheduler, worker) under honcho, plus a traffic player replaying the bundled Azure trace through
the hooks so models are seen warming ahead of demand and being evicted when they go quiet. It prints the
console's URL and login. The web binds loopback unless PREWARM_WEB_HOST says otherwise (then a hook token
is made when none is set). Ctrl-C stops every process it started, the embedded Redis included.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

from prewarm import arg_types
from prewarm.config import Settings, repo_root
from prewarm.config_errors import redacted


def _procfile(path: Path) -> dict[str, str]:
    from honcho.environ import parse_procfile

    return dict(parse_procfile(path.read_text()).processes)


DEFAULT_DEVICES = "cpu:0=1536MiB,cpu:1=1536MiB"
# A vLLM replica holds ~2 GB on CPU (the engine process tree's PSS, measured), more than either default
# virtual GPU: a catalog with a vllm model gets this third device for it.
ENGINE_DEVICE = "cpu:2=4GiB"


def engine_models(catalog: Path) -> list[str]:
    """The ids of the catalog's models served by an engine process (runtime vllm)."""
    from prewarm.catalog import load_catalog

    return [m.id for m in load_catalog(catalog, check_files=False).models if m.runtime == "vllm"]


def adapter_traffic(catalog: Path) -> tuple[list[str], list[str]]:
    """The catalog's LoRA adapters (runtime vllm-adapter) split into those the traffic player gives a steady
    light stream (per base, as many as its engine's LoRA slots, max_adapters) and those it sends nothing:
    nothing unloads an idle adapter to make room yet (the policy's adapter planning, issue 29 item 4), so
    an adapter beyond its base's slots would only wait for one. The light ones load into the running base
    replica on their first request (the route's on-demand adapter load), which the console shows."""
    from prewarm.catalog import load_catalog

    cat = load_catalog(catalog, check_files=False)
    light: list[str] = []
    left: list[str] = []
    for base_id in dict.fromkeys(m.id for m in cat.models if m.runtime == "vllm"):
        base = cat.get(base_id)
        ids = [a.id for a in cat.adapters_of(base_id)]
        light += ids[: base.max_adapters]
        left += ids[base.max_adapters:]
    return light, left


def choose_devices(given: str | None, engines: list[str]) -> str:
    """The devices given (--devices or PREWARM_DEVICES), else the defaults plus ENGINE_DEVICE when an
    engine model is in the catalog."""
    if given:
        return given
    return f"{DEFAULT_DEVICES},{ENGINE_DEVICE}" if engines else DEFAULT_DEVICES


def exposed_hook_token(env: dict[str, str], web_host: str) -> str:
    """With the web told to serve beyond loopback (PREWARM_WEB_HOST) and no hook token, make one for the web
    and the traffic player, as for the admin token (`prewarm web` refuses open hooks there); the banner's
    line for it, or ''."""
    from web.cli import is_loopback

    if env.get("PREWARM_HOOK_TOKEN") or is_loopback(web_host):
        return ""
    env["PREWARM_HOOK_TOKEN"] = secrets.token_urlsafe(16)
    return (f"  web on {web_host}: hooks need 'Authorization: Bearer {env['PREWARM_HOOK_TOKEN']}' "
            "(PREWARM_HOOK_TOKEN)\n")


def cmd_up(args: argparse.Namespace) -> int:
    from honcho.manager import Manager

    from prewarm import runtime
    from web.cli import port_taken

    settings = Settings.from_env()
    port = str(args.port or settings.port)
    taken = port_taken(settings.web_host, int(port))
    if taken is not None:  # else everything starts, and the web alone stops it all 5 s later, deep in its log
        print(f"prewarm up: {settings.web_host}:{port} is taken ({taken}): stop what listens there (another "
              "prewarm up?), or pass --port N / set PORT", file=sys.stderr)
        return 2
    env = dict(os.environ)
    url = runtime.redis_url(settings)  # starts the embedded Redis when none is configured
    env["PREWARM_REDIS_URL"] = url
    try:
        if not os.environ.get("PREWARM_CATALOG"):
            catalog = settings.data_dir / "demo-models" / "catalog.toml"
            # Every time: a no-op when up to date, and it adds the vllm demo model once the engine is installed.
            if not catalog.exists():
                print(f"prewarm: generating the demo models in {catalog.parent} (once)", flush=True)
            subprocess.run([sys.executable, "-m", "prewarm.programs.cli", "models", "demo", "--out",
                            str(catalog.parent)], check=True)
            env["PREWARM_CATALOG"] = str(catalog)
        engines = engine_models(Path(env["PREWARM_CATALOG"]))
        env["PREWARM_DEVICES"] = choose_devices(env.get("PREWARM_DEVICES") or args.devices, engines)
        env.setdefault("PREWARM_NODE", "node-a")
        token = env.get("PREWARM_ADMIN_TOKEN") or secrets.token_urlsafe(12)
        env["PREWARM_ADMIN_TOKEN"] = token
        hook_line = exposed_hook_token(env, settings.web_host)
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
            adapters, idle = adapter_traffic(Path(env["PREWARM_CATALOG"]))
            for m in engines + adapters:  # an engine starts in 30-160 s here: steady light traffic, never thrashed
                replay += ["--light", m]
            for m in idle:
                replay += ["--skip", m]
            if args.trace:
                replay.insert(4, args.trace)
            manager.add_process("traffic", shlex.join(replay), env=env, cwd=str(repo_root()))
        print(f"\n  prewarm console: http://127.0.0.1:{port}/   login token: {token}\n{hook_line}"
              f"  metrics: http://127.0.0.1:{port}/metrics   Redis: {redacted(url)}\n  Ctrl-C stops everything.\n",
              flush=True)
        manager.loop()
        return manager.returncode or 0
    finally:
        runtime.stop_owned()


def register(sub: argparse._SubParsersAction) -> None:
    from prewarm.programs import replay

    p = sub.add_parser("up", help="run the whole system here: Redis, web, scheduler, worker, demo traffic",
                       description="Run the whole system here. The demo catalog serves a Hugging Face checkpoint "
                                   "with transformers always, and a vLLM model when the engine is installed "
                                   "(`prewarm engines install vllm`; the next ./run adds it). With a vllm "
                                   f"model in the catalog and no --devices given, a third device {ENGINE_DEVICE} "
                                   "is added (a vLLM replica holds ~2 GB on CPU) and the traffic player gives "
                                   "that model one request every 20 s instead of bursts, and the same to its LoRA "
                                   "adapters, as many as its engine's slots (max_adapters): they load into "
                                   "the running engine on their first request.")
    p.add_argument("--port", type=arg_types.port, help="web port (default PORT or 8000)")
    # Two CPU virtual GPUs that together hold a little less than the demo catalog (3.1 GB): the
    # scheduler has to choose, so the console shows evictions as well as preloads.
    p.add_argument("--devices", help=f"worker devices (PREWARM_DEVICES wins; default {DEFAULT_DEVICES}, plus "
                                     f"{ENGINE_DEVICE} when the catalog has a vllm model)")
    p.add_argument("--speed", type=arg_types.positive, default=60.0, help="trace seconds per real second")
    p.add_argument("--rate", type=arg_types.non_negative, default=3.0, help="approximate demo requests per real second")
    p.add_argument("--trace", help="trace to replay (default: the bundled Azure sample)")
    p.add_argument("--no-traffic", action="store_true", help="do not start the traffic player")
    p.set_defaults(func=cmd_up)
    replay.register(sub)
