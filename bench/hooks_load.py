"""Load test of the hooks with wrk against one real `prewarm web` (gunicorn) on loopback.

    python bench/hooks_load.py [--seconds 10] [--threads 2] [--connections 16] [--rounds 3] [--json]

It starts its own Redis and `prewarm web` (its default gunicorn workers unless --gunicorn-workers) on free
loopback ports with a generated catalog of `--models` models, then runs wrk (Debian: `apt-get install wrk`)
with the same settings for each phase, against the same server:

  healthz   GET  /healthz                                     the baseline
  single    POST /hooks/requests {"model", "count": 1}        a random model per request
  batch     POST /hooks/requests {"events": [... x --batch]}  as a router's client flushes
  route     GET  /hooks/route?model=<a cold model>            latency percentiles

healthz and single alternate `--rounds` times, so load from other processes on a shared machine hits
both alike; `hook_to_healthz_ratio` is the median of each round's single ÷ healthz requests/s, and
`hook_to_healthz_cpu_ratio` the same from the server's CPU time per request (gunicorn and Redis, measured
with psutil), which other load on the machine disturbs much less. The wrk
command lines are printed (and kept in the JSON) so a run can be repeated by hand (docs/web.md).

Recorded = accepted: Redis's totals are compared with what wrk saw answered 202. wrk stops with up to
`--connections` requests in flight, which the server records but wrk never counts, so the check is
0 <= recorded - accepted <= in-flight bound; `lost` (accepted but not recorded) must be 0.
It reports; it asserts nothing about speed. Traffic goes to 127.0.0.1 only, bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRK_DIR = Path(__file__).resolve().parent / "wrk"
sys.path.insert(0, str(ROOT))


def server_cpu(procs: list) -> float:
    """CPU seconds used so far by the server side: gunicorn (master and workers) and Redis."""
    total = 0.0
    for p in procs:
        for q in [p, *p.children(recursive=True)]:
            try:
                t = q.cpu_times()
                total += t.user + t.system
            except Exception:  # noqa: BLE001 - a worker that exited meanwhile
                pass
    return total


def wrk(url: str, script: str, script_args: list[str], args: argparse.Namespace,
        connections: int | None = None, procs: list | None = None) -> dict:
    conns = connections or args.connections
    cmd = ["wrk", f"-t{args.threads}", f"-c{conns}", f"-d{args.seconds:g}s", "--timeout", "10s",
           "-s", str(WRK_DIR / script), url, "--", *script_args]
    cpu0 = server_cpu(procs or [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=args.seconds + 60).stdout
    cpu = server_cpu(procs or []) - cpu0
    line = next(x for x in out.splitlines() if x.startswith("WRKJSON "))
    res = json.loads(line.removeprefix("WRKJSON "))
    seconds = res["duration_us"] / 1e6
    # As one would type it from the checkout (a long model list shortened).
    shown = [*cmd[:7], f"bench/wrk/{script}", url, "--",
             *(script_args if len(script_args) <= 3 else [*script_args[:3], "..."])]
    return {"requests": res["requests"], "requests_per_s": round(res["requests"] / seconds, 1),
            "errors": sum(res[k] for k in ("connect_errors", "read_errors", "write_errors", "status_errors",
                                           "timeouts")),
            "status_errors": res["status_errors"], "p50_ms": res["p50_us"] / 1000,
            "p99_ms": res["p99_us"] / 1000, "mean_ms": round(res["mean_us"] / 1000, 3),
            "seconds": round(seconds, 3), "connections": conns,
            # Server CPU (web + Redis) per request: what a request costs, whatever else runs on the machine.
            "server_cpu_us_per_request": round(1e6 * cpu / max(1, res["requests"]), 1),
            "command": " ".join(shown)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="each wrk run (default 10)")
    ap.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    ap.add_argument("--connections", type=int, default=16, help="wrk connections (default 16)")
    ap.add_argument("--rounds", type=int, default=3, help="healthz/single pairs (default 3)")
    ap.add_argument("--batch", type=int, default=1000, help="events per batch (default 1000)")
    ap.add_argument("--models", type=int, default=200)
    ap.add_argument("--gunicorn-workers", type=int, help="default: what `prewarm web` starts")
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed: `apt-get install -y wrk` (Debian) or build it from "
              "https://github.com/wg/wrk", file=sys.stderr)
        return 2

    import psutil
    import redis

    from gpu_worker.sized_catalog import write_sized_catalog
    from prewarm import traffic
    from prewarm.redis_server import EmbeddedRedis, free_port

    tmp = Path(tempfile.mkdtemp(prefix="prewarm-load-"))
    models = [f"m{i:04d}" for i in range(args.models)]
    catalog = write_sized_catalog(tmp / "models", {m: 1024 for m in models})
    port = free_port()
    with EmbeddedRedis() as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
        env.update({"PREWARM_REDIS_URL": server.url, "PREWARM_CATALOG": str(catalog), "PORT": str(port),
                    "PREWARM_DATA_DIR": str(tmp / "var")})
        if args.gunicorn_workers:
            env["PREWARM_WEB_WORKERS"] = str(args.gunicorn_workers)
        web = subprocess.Popen([sys.executable, "-m", "prewarm.programs.cli", "web", "--host", "127.0.0.1"], env=env,
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    time.sleep(0.1)
            r = redis.Redis.from_url(server.url)
            procs = [psutil.Process(web.pid), psutil.Process(server.proc.pid)]
            out: dict = {"settings": {"seconds": args.seconds, "threads": args.threads,
                                      "connections": args.connections, "rounds": args.rounds,
                                      "batch": args.batch, "models": args.models,
                                      "gunicorn_workers": args.gunicorn_workers or "prewarm web's default",
                                      "cores": os.cpu_count()},
                         "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
            rounds = []
            for _ in range(args.rounds):
                h = wrk(url, "get.lua", ["/healthz"], args, procs=procs)
                s = wrk(url, "single.lua", models, args, procs=procs)
                rounds.append({"healthz": h, "single": s,
                               "ratio": round(s["requests_per_s"] / max(1e-9, h["requests_per_s"]), 3),
                               "cpu_ratio": round(h["server_cpu_us_per_request"]
                                                  / max(1e-9, s["server_cpu_us_per_request"]), 3)})
            single_accepted = sum(x["single"]["requests"] - x["single"]["status_errors"] for x in rounds)
            single_recorded = sum(traffic.totals(r).values())
            batch = wrk(url, "batch.lua", [str(args.batch), *models], args, connections=min(8, args.connections),
                        procs=procs)
            batch_accepted = (batch["requests"] - batch["status_errors"]) * args.batch
            batch_recorded = sum(traffic.totals(r).values()) - single_recorded
            route = wrk(url, "get.lua", [f"/hooks/route?model={models[0]}"], args, procs=procs)
            out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
            out["rounds"] = rounds
            out["healthz"] = max((x["healthz"] for x in rounds), key=lambda p: p["requests_per_s"])
            out["single"] = max((x["single"] for x in rounds), key=lambda p: p["requests_per_s"])
            out["batch"] = batch
            out["route"] = route
            out["hook_to_healthz_ratio"] = statistics.median(x["ratio"] for x in rounds)
            # The same ratio from server CPU per request: steadier on a machine shared with other work.
            out["hook_to_healthz_cpu_ratio"] = statistics.median(x["cpu_ratio"] for x in rounds)
            out["batched_events_per_server_cpu_s"] = round(
                args.batch * 1e6 / max(1e-9, batch["server_cpu_us_per_request"]), 1)
            out["events_per_s"] = {"single": out["single"]["requests_per_s"],
                                   "batched": round(batch_accepted / batch["seconds"], 1)}
            in_flight = args.connections * args.rounds + min(8, args.connections) * args.batch
            accepted = single_accepted + batch_accepted
            recorded = single_recorded + batch_recorded
            out["accepted_total"] = accepted
            out["recorded_total"] = recorded
            out["lost"] = max(0, accepted - recorded)
            out["recorded_not_acknowledged"] = recorded - accepted  # in flight when wrk stopped
            out["recorded_equals_accepted"] = 0 <= recorded - accepted <= in_flight
        finally:
            os.killpg(web.pid, 15)
            web.wait(timeout=20)
            shutil.rmtree(tmp, ignore_errors=True)
    if not args.json:
        for x in rounds:
            print(f"healthz {x['healthz']['requests_per_s']:>8.0f} req/s   single {x['single']['requests_per_s']:>8.0f}"
                  f" req/s   ratio {x['ratio']:.2f}   server CPU per request {x['healthz']['server_cpu_us_per_request']:.0f}"
                  f" / {x['single']['server_cpu_us_per_request']:.0f} us (ratio {x['cpu_ratio']:.2f})", file=sys.stderr)
        print(f"batches of {args.batch}: {out['events_per_s']['batched']:,.0f} events/s; route p50 "
              f"{route['p50_ms']} ms p99 {route['p99_ms']} ms; load average {out['loadavg_before']} -> "
              f"{out['loadavg_after']}", file=sys.stderr)
        for name in ("healthz", "single", "batch", "route"):
            print(f"  {name}: {out[name]['command']}", file=sys.stderr)
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
