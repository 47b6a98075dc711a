"""Load test of the hooks: several processes posting to gunicorn on loopback for a bounded time.

    python bench/hooks_load.py [--seconds 60] [--procs 4] [--models 200]

It starts its own Redis and `prewarm web` (gunicorn) on free loopback ports with a generated catalog,
then measures, each phase for `--seconds`:
  1. single events      POST /hooks/requests {"model", "count": 1}
  2. batches of 100      POST /hooks/requests {"events": [...]}
  3. /hooks/route        GET  latency percentiles (p50/p99)
  4. /healthz            GET  the baseline: recording a request should cost little more than this
and checks that the totals Redis recorded equal the totals the server accepted. It prints one JSON
object. It reports; it asserts nothing about speed. Traffic goes to 127.0.0.1 only, bounded in time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _worker(kind: str, url: str, models: list[str], seconds: float, q: mp.Queue) -> None:
    s = requests.Session()
    rng = random.Random(os.getpid())
    n_req = accepted = errors = 0
    lat: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        try:
            if kind == "single":
                resp = s.post(f"{url}/hooks/requests", json={"model": rng.choice(models), "count": 1})
                ok = resp.status_code == 202
                accepted += resp.json().get("accepted", 0) if ok else 0
            elif kind == "batch":
                evs = [{"model": rng.choice(models), "count": 1} for _ in range(100)]
                resp = s.post(f"{url}/hooks/requests", json={"events": evs})
                ok = resp.status_code == 202
                accepted += resp.json().get("accepted", 0) if ok else 0
            elif kind == "route":
                resp = s.get(f"{url}/hooks/route", params={"model": rng.choice(models)})
                ok = resp.status_code == 200
            else:
                resp = s.get(f"{url}/healthz")
                ok = resp.status_code == 200
        except requests.RequestException:
            ok = False
        lat.append(time.perf_counter() - t0)
        n_req += 1
        errors += 0 if ok else 1
    q.put({"requests": n_req, "accepted": accepted, "errors": errors, "lat": lat})


def phase(kind: str, url: str, models: list[str], seconds: float, procs: int) -> dict:
    q: mp.Queue = mp.Queue()
    ps = [mp.Process(target=_worker, args=(kind, url, models, seconds, q)) for _ in range(procs)]
    t0 = time.monotonic()
    for p in ps:
        p.start()
    results = [q.get() for _ in ps]
    for p in ps:
        p.join()
    wall = time.monotonic() - t0
    lat = sorted(x for r in results for x in r["lat"])
    n = sum(r["requests"] for r in results)
    return {"requests": n, "requests_per_s": round(n / wall, 1), "accepted": sum(r["accepted"] for r in results),
            "errors": sum(r["errors"] for r in results),
            "p50_ms": round(1000 * lat[len(lat) // 2], 2) if lat else None,
            "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2) if lat else None,
            "mean_ms": round(1000 * statistics.fmean(lat), 2) if lat else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--models", type=int, default=200)
    ap.add_argument("--gunicorn-workers", type=int, default=4)
    args = ap.parse_args()

    from gpu_worker.sized_catalog import write_sized_catalog
    from prewarm.redis_server import EmbeddedRedis, free_port

    tmp = Path(tempfile.mkdtemp(prefix="prewarm-load-"))
    models = [f"m{i:04d}" for i in range(args.models)]
    catalog = write_sized_catalog(tmp / "models", {m: 1024 for m in models})
    port = free_port()
    with EmbeddedRedis() as server:
        env = {**os.environ, "PREWARM_REDIS_URL": server.url, "PREWARM_CATALOG": str(catalog), "PORT": str(port),
               "PREWARM_DATA_DIR": str(tmp / "var"), "PREWARM_WEB_WORKERS": str(args.gunicorn_workers)}
        env.pop("PREWARM_HOOK_TOKEN", None)
        web = subprocess.Popen([sys.executable, "-m", "prewarm.cli", "web"], env=env, cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(200):
                try:
                    if requests.get(f"{url}/healthz", timeout=1).ok:
                        break
                except requests.RequestException:
                    time.sleep(0.1)
            out = {"settings": {"seconds": args.seconds, "procs": args.procs, "models": args.models,
                                "gunicorn_workers": args.gunicorn_workers, "cores": os.cpu_count()}}
            for kind in ("healthz", "single", "batch", "route"):
                out[kind] = phase(kind, url, models, args.seconds, args.procs)
            r = redis.Redis.from_url(server.url)
            from prewarm import traffic

            recorded = sum(traffic.totals(r).values())
            accepted = out["single"]["accepted"] + out["batch"]["accepted"]
            out["recorded_total"] = recorded
            out["accepted_total"] = accepted
            out["recorded_equals_accepted"] = recorded == accepted
            out["events_per_s"] = {"single": out["single"]["requests_per_s"],
                                   "batched": round(out["batch"]["accepted"] / args.seconds, 1)}
            out["hook_to_healthz_ratio"] = round(out["single"]["requests_per_s"]
                                                 / max(1e-9, out["healthz"]["requests_per_s"]), 3)
            print(json.dumps(out, indent=2))
        finally:
            web.terminate()
            web.wait(timeout=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
