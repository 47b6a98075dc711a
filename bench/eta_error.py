"""How well the route hook's ETA promises hold, on real processes: real − promised time to ready.

    python bench/eta_error.py [--rounds 5] [--max-loads 1] [--devices cpu:0=512MiB]

Starts its own Redis, a `prewarm worker`, `prewarm web` and `prewarm scheduler` on loopback with the small demo catalog
(real safetensors, real torch loads), then each round asks /hooks/route for every model at once (each
one cold: one on-demand preload each, queued behind each other on the GPU's --max-loads slots), waits
until all are ready, and evicts them all. It prints one JSON object: the real − promised seconds of every
first promise (the bench's own record: ready time from the worker's replica record) with its median and
p95, and the quantile bounds of prewarm_route_eta_error_seconds as the system recorded it. It reports;
it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from prewarm.domain import states as rs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ADMIN = "eta-bench-admin"


def _wait(cond, timeout: float, what: str):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise SystemExit(f"eta bench: timed out waiting for {what}")


def _q(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-loads", type=int, default=1)
    ap.add_argument("--devices", default="cpu:0=512MiB")
    args = ap.parse_args()
    from gpu_worker.demo_models import write_demo
    from prewarm import metrics_defs, state
    from prewarm.redis_server import EmbeddedRedis, free_port
    from prewarm.store import histograms

    tmp = Path(tempfile.mkdtemp(prefix="prewarm-eta-"))
    catalog = write_demo(tmp / "models", small=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with EmbeddedRedis() as server:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")},
               "PREWARM_REDIS_URL": server.url, "PREWARM_CATALOG": str(catalog), "PORT": str(port),
               "PREWARM_DATA_DIR": str(tmp), "PREWARM_DEVICES": args.devices, "PREWARM_NODE": "bench",
               "PREWARM_MAX_LOADS_PER_GPU": str(args.max_loads), "PREWARM_ADMIN_TOKEN": ADMIN,
               "PREWARM_HEARTBEAT_SECONDS": "0.5", "PYTHONPATH": str(ROOT)}
        procs = [subprocess.Popen([sys.executable, "-m", "prewarm.programs.cli", cmd], env=env, cwd=ROOT,
                                  stdout=open(tmp / f"{cmd}.log", "wb"), stderr=subprocess.STDOUT,
                                  start_new_session=True) for cmd in ("worker", "web", "scheduler")]
        try:
            r = server._client()
            _wait(lambda: _healthy(url) and state.read_fleet(r).alive(), 120, "web and worker")
            models = requests.get(f"{url}/api/models", timeout=10).json()["models"]
            ids = [m["id"] for m in models]
            errors: list[dict] = []
            for _ in range(args.rounds):
                asked = {}
                for m in ids:
                    t0 = time.time()
                    body = requests.get(f"{url}/hooks/route", params={"model": m}, timeout=10).json()
                    if body["state"] != rs.ROUTE_READY:
                        asked[m] = (t0, body["eta_seconds"], body["state"])

                def ready(want: dict = asked) -> dict[str, float] | None:
                    reps = {x.model: x.since for x in state.read_fleet(r).replicas() if x.state == rs.READY}
                    return reps if all(m in reps for m in want) else None

                since = _wait(ready, 120, f"every model ready: asked {sorted(asked)}, ready "
                                          f"{sorted(x.model for x in state.read_fleet(r).replicas())}")
                for m, (t0, promised, st) in asked.items():
                    real = since[m] - t0
                    errors.append({"model": m, "state": st, "promised_s": promised, "real_s": round(real, 3),
                                   "error_s": round(real - promised, 3)})
                for m in ids:
                    requests.post(f"{url}/api/models/{m}/evict", json={},
                                  headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
                _wait(lambda: not state.read_fleet(r).replicas(), 120, "every model evicted")
            h = histograms.read(r, (metrics_defs.ETA_ERROR,))[metrics_defs.ETA_ERROR.name]
            counts, prev = {}, 0
            for bound, cum in h.buckets:
                counts[bound] = cum - prev
                prev = cum
            errs = [e["error_s"] for e in errors]
            print(json.dumps({
                "rounds": args.rounds, "models": len(ids), "max_loads_per_gpu": args.max_loads,
                "devices": args.devices, "promises": len(errs),
                "error_s": {"median": statistics.median(errs), "p95": _q(errs, 0.95), "min": min(errs),
                            "max": max(errs), "mean_abs": statistics.mean(abs(x) for x in errs)},
                "metric": {"count": h.count, "sum": round(h.sum, 3),
                           "median_bound": metrics_defs.ETA_ERROR.quantile_bound(counts, 0.5),
                           "p95_bound": metrics_defs.ETA_ERROR.quantile_bound(counts, 0.95)},
                "promises_detail": errors}, indent=2))
        finally:
            for p in procs:
                try:
                    os.killpg(p.pid, 15)
                    p.wait(30)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(p.pid, 9)
    return 0


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
