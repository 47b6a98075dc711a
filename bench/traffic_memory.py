"""Redis memory of the traffic store for many models over a day, written through `prewarm.traffic.record`.

    python bench/traffic_memory.py [--models 10000] [--rate 300] [--hours 24] [--zipf 1.1] [--json]

It starts its own Redis and records `--hours` of synthetic traffic ending now: `--rate` requests/s in
all, spread over `--models` models with Zipf(`--zipf`) popularity (Poisson counts per model per minute,
and per second for the last 15 minutes), one `record` call per minute or second as the hook would make
them. Buckets get the expiry they are designed with (per-second 15 min, per-minute 8 days; a per-second
bucket already past its retention is not written), so what Redis holds afterwards is a day's traffic.
It also measures the worst case, every model requested every minute, on `--dense-minutes` minutes and
scales it to the day. Figures: Redis `used_memory` above the empty server, and per key kind.
It reports; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _used(r) -> int:  # noqa: ANN001
    return int(r.info("memory")["used_memory"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=300.0, help="requests per second over all models")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--dense-minutes", type=int, default=30, help="minutes of the every-model worst case")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import redis

    from prewarm import keys, traffic
    from prewarm.redis_server import EmbeddedRedis

    rng = np.random.default_rng(args.seed)
    ids = np.array([f"model-{i:05d}" for i in range(args.models)])
    weights = 1.0 / np.arange(1, args.models + 1) ** args.zipf
    rates = args.rate * weights / weights.sum()  # requests per second per model
    now = time.time()
    minutes = int(args.hours * 60)
    out: dict = {"settings": vars(args)}
    with EmbeddedRedis() as server:
        r = redis.Redis.from_url(server.url)
        base = _used(r)
        t0 = time.monotonic()
        requests = 0
        first_minute = traffic.bucket_start(now, 60) - minutes * 60
        for m in range(minutes):  # per-minute batches (their per-second buckets mostly past retention)
            start = first_minute + m * 60
            counts = rng.poisson(rates * 60)
            nz = np.nonzero(counts)[0]
            secs = rng.integers(0, 60, size=len(nz))
            events = [(str(ids[i]), int(counts[i]), float(start + s)) for i, s in zip(nz, secs, strict=True)
                      if start + s < now]
            requests += traffic.record(r, events, now=now)
        out["record_seconds"] = round(time.monotonic() - t0, 1)
        out["requests"] = requests
        out["active_models"] = len(traffic.totals(r))
        out["used_bytes"] = _used(r) - base
        kinds = {"minute buckets": 0, "second buckets": 0, "totals and last request": 0}
        n_keys = {"minute buckets": 0, "second buckets": 0}
        for k in r.scan_iter(match=keys.PREFIX + "*", count=1000):
            size = r.memory_usage(k, samples=0) or 0
            name = k.decode()
            if name.startswith(keys.traffic_bucket(60, 0).rsplit(":", 1)[0] + ":"):
                kinds["minute buckets"] += size
                n_keys["minute buckets"] += 1
            elif name.startswith(keys.traffic_bucket(1, 0).rsplit(":", 1)[0] + ":"):
                kinds["second buckets"] += size
                n_keys["second buckets"] += 1
            else:
                kinds["totals and last request"] += size
        out["bytes_by_kind"] = kinds
        out["keys"] = n_keys
        # Every key the store writes expires, except the two per-model records (bounded by the catalog).
        out["keys_without_expiry"] = sorted(k.decode() for k in r.scan_iter(match=keys.PREFIX + "*")
                                            if r.ttl(k) == -1)
        # Worst case: every model in every minute, measured on a sample of minutes and scaled to the day.
        r.flushall()
        base = _used(r)
        dense_start = traffic.bucket_start(now, 60) - (args.dense_minutes + 16) * 60  # no per-second buckets
        for m in range(args.dense_minutes):
            t = float(dense_start + m * 60)
            traffic.record(r, [(str(x), 1, t) for x in ids], now=now)
        per_minute = (_used(r) - base) / args.dense_minutes
        out["dense_bytes_per_minute_bucket"] = round(per_minute)
        out["dense_day_bytes"] = round(per_minute * minutes)
        out["dense_8_day_bytes"] = round(per_minute * traffic.MINUTE_TTL_S / 60)
    if not args.json:
        mib = 1024 * 1024
        print(f"{args.models:,} models, {args.rate:g} req/s Zipf({args.zipf}), {args.hours:g} h: {requests:,} "
              f"requests, {out['active_models']:,} models seen; Redis holds {out['used_bytes'] / mib:.1f} MiB "
              f"({', '.join(f'{k} {v / mib:.1f} MiB' for k, v in kinds.items())}); keys without expiry: "
              f"{out['keys_without_expiry']}", file=sys.stderr)
        print(f"every model every minute: {out['dense_bytes_per_minute_bucket'] / 1024:.0f} KiB per minute "
              f"bucket, {out['dense_day_bytes'] / mib:.0f} MiB a day, {out['dense_8_day_bytes'] / mib:.0f} MiB "
              f"for the 8 days minute buckets are kept", file=sys.stderr)
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
