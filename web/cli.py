"""`prewarm web`: the Flask app under gunicorn on PORT.

It binds loopback unless told otherwise (--host, PREWARM_WEB_HOST), and refuses to serve the hooks on any
other address without PREWARM_HOOK_TOKEN: anyone who reaches an open hook can inject traffic and start
loads (`GET /hooks/route` preloads a cold model). `--insecure-no-hook-token` serves them open anyway.

Metrics: gunicorn runs several worker processes, so prometheus_client's multiprocess mode is switched on
(PROMETHEUS_MULTIPROC_DIR, set here before anything imports prometheus_client when the environment does
not set it) and each dead worker's files are marked as such.
"""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import os
import shutil
import socket
import sys
from typing import Any

from prewarm import arg_types
from prewarm.config import DEFAULT_WEB_HOST, Settings


def _multiproc_dir(data_dir: str) -> tuple[str, bool]:
    """The multiprocess metrics folder, and whether we created it (and so remove it on exit)."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    created = not path
    if not path:
        path = os.path.join(data_dir, f"prometheus-web-{os.getpid()}")
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):  # leftovers from an earlier run would be summed in
            if name.endswith(".db"):
                os.unlink(os.path.join(path, name))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    os.makedirs(path, exist_ok=True)
    return path, created


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves this machine alone (127.0.0.0/8, ::1, localhost); 0.0.0.0 and :: serve all."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any address


def port_taken(host: str, port: int) -> str | None:
    """Why the web could not listen on host:port now (gunicorn's bind, tried first), or None if it can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # PREWARM_WEB_HOST may be "::"
    try:
        with socket.create_server((host, port), family=family):
            return None
    except OSError as e:
        return os.strerror(e.errno) if e.errno else str(e)


def bind_host(args: argparse.Namespace, settings: Settings) -> str:
    return args.host or settings.web_host


def open_hooks_refusal(host: str, settings: Settings, insecure: bool) -> str | None:
    """Why `prewarm web` must not serve on `host` (None: it may)."""
    if settings.hook_token or insecure or is_loopback(host):
        return None
    return (f"prewarm web: refusing to serve the hooks on {host} without a hook token: anyone who reaches the port "
            "could report traffic and start model loads. Set PREWARM_HOOK_TOKEN (and give the request router the "
            "same token), bind loopback (--host 127.0.0.1, the default, or PREWARM_WEB_HOST), or pass "
            "--insecure-no-hook-token to serve them open anyway")


def cmd_web(args: argparse.Namespace) -> int:
    from prewarm import runtime

    settings = Settings.from_env()
    host = bind_host(args, settings)
    refusal = open_hooks_refusal(host, settings, args.insecure_no_hook_token)
    if refusal:  # before anything starts (Redis, gunicorn): nothing is left behind
        print(refusal, file=sys.stderr)
        return 2
    port = args.port or settings.port
    taken = port_taken(host, int(port))
    if taken is not None:  # else Redis starts and gunicorn retries the bind for 5 s before it gives up
        print(f"prewarm web: {host}:{port} is taken ({taken}): stop what listens there, or pass --port N / set PORT",
              file=sys.stderr)
        return 2
    metrics_dir, own_metrics_dir = _multiproc_dir(str(settings.data_dir))
    # Resolve (or start) Redis once in the master, so every worker shares it and we own its lifetime.
    url = runtime.redis_url(settings, start=True)
    os.environ["PREWARM_REDIS_URL"] = url
    workers = args.workers or settings.web_workers

    from gunicorn.app.base import BaseApplication

    def child_exit(_server: Any, worker: Any) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)

    def post_fork(_server: Any, _worker: Any) -> None:
        # A worker inherits the master's embedded-Redis handle and its atexit hook: the master alone
        # stops that Redis, so drop the hook in the worker.
        owned = getattr(runtime, "_owned", None)
        if owned is not None:
            atexit.unregister(owned.stop)

    class _App(BaseApplication):
        def load_config(self) -> None:
            self.cfg.set("bind", f"{host}:{port}")
            self.cfg.set("workers", workers)
            self.cfg.set("worker_class", "gthread")
            self.cfg.set("threads", args.threads)
            self.cfg.set("timeout", 60)
            self.cfg.set("graceful_timeout", 10)
            self.cfg.set("keepalive", 5)
            self.cfg.set("child_exit", child_exit)
            self.cfg.set("post_fork", post_fork)
            self.cfg.set("accesslog", "-" if args.access_log else None)
            self.cfg.set("proc_name", "prewarm-web")
            if "control_socket_disable" in self.cfg.settings:
                # One shared control socket path per user would make two `prewarm web`s collide.
                self.cfg.set("control_socket_disable", True)

        def load(self) -> Any:
            from web.app import create_app

            return create_app()

    print(f"prewarm web: http://{host}:{port}/ ({workers} workers × {args.threads} threads)",
          file=sys.stderr, flush=True)
    master = os.getpid()
    try:
        _App().run()
    finally:
        # gunicorn's forked workers leave through this frame too (SystemExit): only the master owns Redis.
        if os.getpid() == master:
            runtime.stop_owned()
            if own_metrics_dir:
                shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("web", help="serve the console, JSON API, hooks and /metrics (gunicorn on PORT)")
    p.add_argument("--host", help=f"address to bind (default PREWARM_WEB_HOST or {DEFAULT_WEB_HOST}, loopback; "
                                  "any other address needs PREWARM_HOOK_TOKEN)")
    p.add_argument("--insecure-no-hook-token", action="store_true",
                   help="serve the hooks without PREWARM_HOOK_TOKEN on a non-loopback address (anyone who "
                        "reaches the port can inject traffic and start loads)")
    p.add_argument("--port", type=arg_types.port, help="port (default PORT or 8000)")
    p.add_argument("--workers", type=arg_types.whole_at_least(1), help="gunicorn worker processes (default PREWARM_WEB_WORKERS or 2)")
    p.add_argument("--threads", type=arg_types.whole_at_least(1), default=8, help="threads per worker (default 8)")
    p.add_argument("--access-log", action="store_true", help="log every request to stderr")
    p.set_defaults(func=cmd_web)
