"""A client for request routers: report traffic to prewarm and ask where a model is warm.

    from prewarm.client import TrafficReporter

    reporter = TrafficReporter("http://prewarm-web:8000", token=os.environ.get("PREWARM_HOOK_TOKEN"))
    reporter.report("lm-small")            # in the request path: a dict increment under a lock, never I/O
    answer = reporter.route("lm-small")    # {"model", "version", "state", "replicas", ...} from /hooks/route
    ...
    reporter.close()                       # flushes what is left (bounded by `close_timeout`)

Reporting: `report()` counts requests in memory per (model, second); a background thread posts them to
`POST /hooks/requests` as batches of at most `batch_size` events (each `{"model", "count", "ts"}`), every
`flush_interval` seconds or as soon as `batch_size` new events are waiting, whichever comes first. The
request path never blocks on the network and never sees an exception: while prewarm is unreachable the
counts stay buffered (at most `max_pending` (model, second) entries; what does not fit is dropped and
counted in `stats()["dropped"]`), and are sent with their own timestamps once it answers again, so a
late batch lands in the right traffic buckets. A batch prewarm refuses for one event (an unknown model:
batches are all-or-nothing) is resent without that event, counted in `stats()["rejected"]`. Delivery is
at least once: a post that times out (`timeout`, 2 s by default, far above the hook's latency) is sent
again, and is counted twice if prewarm had recorded it meanwhile (the hook has no idempotency key).
`flush()` waits until everything reported before it is delivered (for shutdown and tests).

Routing: `route(model)` asks `GET /hooks/route` and keeps an answer whose state is `ready` for
`route_ttl` seconds (a hot model's lookups then cost no round trip); answers for loading or cold models
are never cached, so a router waiting for one sees its progress (pass `retry=True` on those repeat
lookups so prewarm's hit rate counts requests, not polls). `route` never raises either: when prewarm
cannot be asked it returns the last ready answer if it is at most `stale_ttl` old (with `"stale": true`),
else `{"model", "state": "unknown", "replicas": [], "error"}`.

Standard library only (http.client), so a router can vendor this one file.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.parse
from typing import Any

from prewarm.domain import states as rs

log = logging.getLogger(__name__)

MAX_EVENT_AGE_S = 8 * 24 * 3600 - 600  # prewarm refuses events older than its coarse buckets keep (8 days)


class _Http:
    """One keep-alive connection per thread to prewarm's web, reopened after any failure."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url: expected http://host[:port] or https://host[:port], got {url!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port
        self.base = parts.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            conn = self._local.conn = cls(self.host, self.port, timeout=self.timeout)
        return conn

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        """(status, parsed JSON body or None); raises OSError / http.client.HTTPException on transport failure."""
        conn = self._conn()
        try:
            conn.request(method, self.base + path, body=body, headers=self.headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self._local.conn = None
            raise
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, None

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


class TrafficReporter:
    def __init__(self, url: str, token: str | None = None, *, flush_interval: float = 0.25,
                 batch_size: int = 1000, max_pending: int = 100_000, timeout: float = 2.0,
                 route_ttl: float = 1.0, stale_ttl: float = 30.0, close_timeout: float = 5.0) -> None:
        if not 1 <= batch_size <= 10_000:
            raise ValueError(f"batch_size: between 1 and 10,000 (prewarm's batch limit), got {batch_size}")
        if flush_interval <= 0 or max_pending < 1:
            raise ValueError("flush_interval must be > 0 and max_pending >= 1")
        self._http = _Http(url, token, timeout)
        self.flush_interval = flush_interval
        self.batch_size = batch_size
        self.max_pending = max_pending
        self.route_ttl = route_ttl
        self.stale_ttl = stale_ttl
        self.close_timeout = close_timeout
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, int], int] = {}  # (model, Unix second) -> requests
        self._new_events = 0  # report() calls since the last flush began
        self._counts = {"reported": 0, "sent": 0, "dropped": 0, "rejected": 0, "failures": 0}
        self._routes: dict[tuple[str, str | None], tuple[float, dict[str, Any]]] = {}
        # flush() waits on these: each cycle of the flusher takes the whole buffer under the lock (_taken
        # numbers them) and _delivered is the newest cycle that ended with nothing put back. What failed is
        # put back for the next cycle, so all reported before cycle n took the buffer is delivered (sent,
        # refused or dropped) once _delivered >= n.
        self._cycle_done = threading.Condition(self._lock)
        self._taken = 0
        self._delivered = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prewarm-reporter", daemon=True)
        self._thread.start()

    # --- the request path ---------------------------------------------------------------------------
    def report(self, model: str, count: int = 1) -> None:
        """Count `count` requests for `model` now. Never blocks on I/O, never raises."""
        try:
            key = (model, int(time.time()))
            with self._lock:
                self._counts["reported"] += count
                if key in self._pending:
                    self._pending[key] += count
                elif len(self._pending) < self.max_pending:
                    self._pending[key] = count
                else:  # prewarm unreachable for long: bounded memory, and the loss is counted
                    self._counts["dropped"] += count
                    return
                self._new_events += 1
                full = self._new_events >= self.batch_size
            if full:
                self._wake.set()
        except Exception:  # noqa: BLE001 - a reporting bug must never fail the router's request
            log.exception("prewarm reporter: report() failed")

    def route(self, model: str, version: str | None = None, *, retry: bool = False) -> dict[str, Any]:
        """prewarm's route answer for `model` (see the module docstring); never raises."""
        key = (model, version)
        now = time.monotonic()
        cached = self._routes.get(key)
        if cached is not None and not retry and now - cached[0] < self.route_ttl:
            return cached[1]
        params = {"model": model, **({"version": version} if version else {}), **({"retry": "1"} if retry else {})}
        try:
            status, body = self._http.request("GET", "/hooks/route?" + urllib.parse.urlencode(params))
            if status == 200 and isinstance(body, dict):
                if body.get("state") == rs.ROUTE_READY:
                    self._routes[key] = (time.monotonic(), body)
                else:
                    self._routes.pop(key, None)
                return body
            error = (body or {}).get("error") if isinstance(body, dict) else None
            reason = f"prewarm answered {status}: {error or 'no message'}"
        except Exception as exc:  # noqa: BLE001 - the router decides what to do without an answer
            reason = f"prewarm unreachable: {type(exc).__name__}: {exc}"
        if cached is not None and now - cached[0] < self.stale_ttl:
            return {**cached[1], "stale": True}
        return {"model": model, "version": version, "state": "unknown", "replicas": [], "error": reason}

    # --- the background flusher ----------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """reported / sent / dropped (buffer full or too old) / rejected (refused by prewarm) requests,
        failures (posts that did not get an answer), pending (buffered (model, second) entries)."""
        with self._lock:
            return {**self._counts, "pending": len(self._pending)}

    def flush(self, timeout: float = 5.0) -> bool:
        """Have everything reported before this call sent now (or refused, or dropped), and wait for it:
        True once it is, False after `timeout` (prewarm unreachable: it stays buffered for later).
        Reports made meanwhile, from other threads, are not waited for. Not for the request path."""
        deadline = time.monotonic() + timeout
        with self._cycle_done:
            # What was reported so far is in the buffer (the next cycle takes it) or in the cycle in flight.
            target = self._taken + 1 if self._pending else self._taken
            while self._delivered < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._wake.set()  # the next cycle at once, not after flush_interval or a backoff
                self._cycle_done.wait(min(left, 0.05))
            return True

    def close(self) -> None:
        """Flush what is left (at most `close_timeout` seconds) and stop the thread."""
        if self._thread.is_alive():
            self.flush(self.close_timeout)
            self._stop.set()
            self._wake.set()
            self._thread.join(self.close_timeout)
        self._http.close()

    def __enter__(self) -> TrafficReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            self._wake.wait(max(self.flush_interval, backoff))
            self._wake.clear()
            ok = False
            with self._lock:
                taken, self._pending = self._pending, {}
                self._new_events = 0
                self._taken += 1
                cycle = self._taken
            try:
                ok = self._flush_once(taken)
                backoff = 0.0 if ok else min(5.0, max(self.flush_interval, backoff * 2))
            except Exception:  # noqa: BLE001 - the thread must outlive any bug, or reporting stops silently
                log.exception("prewarm reporter: flush failed")
                backoff = 1.0
            finally:
                with self._cycle_done:
                    if ok:
                        self._delivered = cycle
                    self._cycle_done.notify_all()

    def _flush_once(self, taken: dict[tuple[str, int], int]) -> bool:
        """Send what one cycle took from the buffer, in batches; False when prewarm could not be reached
        (what is unsent is put back for the next cycle)."""
        oldest = time.time() - MAX_EVENT_AGE_S
        items = []
        for (model, second), n in taken.items():
            if second < oldest:
                self._count("dropped", n)  # older than prewarm keeps: it would refuse the whole batch
            else:
                items.append((model, second, n))
        for start in range(0, len(items), self.batch_size):
            batch = items[start:start + self.batch_size]
            if not self._post(batch):
                self._requeue([x for chunk in (batch, items[start + self.batch_size:]) for x in chunk])
                return False
        return True

    def _post(self, batch: list[tuple[str, int, int]]) -> bool:
        """Post one batch; drop events prewarm refuses one by one. False when prewarm did not answer."""
        while batch:
            body = json.dumps({"events": [{"model": m, "count": n, "ts": s} for m, s, n in batch]}).encode()
            try:
                status, answer = self._http.request("POST", "/hooks/requests", body)
            except Exception as exc:  # noqa: BLE001 - unreachable: keep the batch for the next try
                self._count("failures", 1)
                log.debug("prewarm reporter: post failed: %s", exc)
                return False
            if status == 202:
                self._count("sent", sum(n for _, _, n in batch))
                return True
            if status >= 500 or status == 429:
                self._count("failures", 1)
                return False
            bad = _event_index((answer or {}).get("field") if isinstance(answer, dict) else None)
            if bad is None or bad >= len(batch):  # refused as a whole (401, 413, ...): resending won't help
                log.warning("prewarm reporter: batch of %d events refused (%d): %s", len(batch), status,
                            (answer or {}).get("error") if isinstance(answer, dict) else answer)
                self._count("rejected", sum(n for _, _, n in batch))
                return True
            log.warning("prewarm reporter: event refused: %s", (answer or {}).get("error"))
            self._count("rejected", batch[bad][2])
            batch = batch[:bad] + batch[bad + 1:]
        return True

    def _requeue(self, items: list[tuple[str, int, int]]) -> None:
        with self._lock:
            for model, second, n in items:
                key = (model, second)
                if key in self._pending:
                    self._pending[key] += n
                elif len(self._pending) < self.max_pending:
                    self._pending[key] = n
                else:
                    self._counts["dropped"] += n

    def _count(self, what: str, n: int) -> None:
        with self._lock:
            self._counts[what] += n


def _event_index(field: object) -> int | None:
    """'events[12].model' -> 12; anything else -> None."""
    if not isinstance(field, str) or not field.startswith("events["):
        return None
    idx, _, _ = field[len("events["):].partition("]")
    return int(idx) if idx.isdigit() else None
