"""`prewarm scheduler`: the planning scheduler process."""

from __future__ import annotations

import argparse
import logging
import sys

from prewarm import arg_types


def cmd_scheduler(args: argparse.Namespace) -> int:
    from prewarm.config import Settings
    from prewarm.context import Context
    from scheduler.live import Scheduler

    logging.basicConfig(level=logging.INFO, format="%(asctime)s scheduler %(levelname)s %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # one line per tick drowns the decisions
    settings = Settings.from_env()
    port = args.metrics_port if args.metrics_port is not None else settings.scheduler_metrics_port
    if port:
        from prometheus_client import start_http_server

        # loopback unless told: the tick metrics are harmless, but a port is opened only where asked
        host = args.metrics_host or settings.scheduler_metrics_host
        try:
            start_http_server(port, addr=host)
        except OSError as e:  # before any tick: a scheduler whose metrics cannot be read is refused, not half-run
            print(f"prewarm scheduler: cannot serve metrics on {host}:{port} ({e.strerror or e}): stop what listens "
                  "there, or pass --metrics-port N / set PREWARM_SCHEDULER_METRICS_PORT (0: off)", file=sys.stderr)
            return 2
    Scheduler(Context()).run()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scheduler", help="run the warming scheduler (one leader plans; others stand by)")
    p.add_argument("--metrics-port", type=arg_types.port_or_off, help="expose prewarm_scheduler_tick_seconds here "
                                                    "(default PREWARM_SCHEDULER_METRICS_PORT; 0 = off)")
    p.add_argument("--metrics-host", help="address the metrics port binds (default PREWARM_SCHEDULER_METRICS_HOST "
                                          "or 127.0.0.1; 0.0.0.0 in a pod, for Prometheus)")
    p.set_defaults(func=cmd_scheduler)
