"""The replay through the real hooks, as a request router would: each request at its due time reports itself
(`POST /hooks/requests`, batched per half second with its own second as `ts`) and asks `GET /hooks/route`; an
answer other than `ready` is a cold start, which polls (retry=1) until a replica is ready."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import requests

from prewarm.domain import states as rs

POLL_S = 0.05  # how often a waiting request asks again
COLD_TIMEOUT_S = 120.0


class _Session(threading.local):
    def __init__(self) -> None:
        self.s = requests.Session()


def replay(url: str, models: list[str], times: np.ndarray, mids: np.ndarray) -> dict:
    """Replay (real seconds from now); returns requests, cold starts, added waits, failures and how long the last waiting requests took after the last one was due."""
    local = _Session()
    waits: list[float] = []
    failed: list[str] = []
    lock = threading.Lock()

    def serve(model: str, due: float) -> None:
        s = local.s
        cold = False
        try:
            while True:
                answer = s.get(f"{url}/hooks/route", params={"model": model, **({"retry": "1"} if cold else {})},
                               timeout=30).json()
                if answer.get("state") == rs.ROUTE_READY:
                    break
                cold = True
                if time.monotonic() - due > COLD_TIMEOUT_S:
                    raise TimeoutError(f"{model}: no replica ready after {COLD_TIMEOUT_S:g} s")
                time.sleep(POLL_S)
            if cold:
                with lock:
                    waits.append(time.monotonic() - due)
        except Exception as exc:  # one failed request is a figure, not the end of the replay
            with lock:
                failed.append(str(exc)[:200])

    reporter = requests.Session()
    pending: Counter[tuple[str, int]] = Counter()

    def flush() -> None:
        if pending:
            events = [{"model": m, "count": c, "ts": ts} for (m, ts), c in pending.items()]
            reporter.post(f"{url}/hooks/requests", json={"events": events}, timeout=30).raise_for_status()
            pending.clear()

    start = time.monotonic()
    wall0 = time.time()
    last_flush = start
    with ThreadPoolExecutor(max_workers=256) as pool:
        for t, m in zip(times.tolist(), mids.tolist(), strict=True):
            due = start + t
            while (now := time.monotonic()) < due:
                if pending and now - last_flush >= 0.5:
                    flush()
                    last_flush = now
                time.sleep(min(due - now, 0.05))
            model = models[m]
            pending[(model, int(wall0 + t))] += 1
            pool.submit(serve, model, due)
        flush()
    return {"requests": len(times), "cold_starts": len(waits) + sum(1 for f in failed if "no replica" in f),
            "waits": waits, "failed": len(failed), "errors": sorted(set(failed))[:5],
            "drain_s": round(max(0.0, time.monotonic() - start - (float(times[-1]) if len(times) else 0.0)), 2)}
