"""Group commit for batches posted to `POST /hooks/requests`: the batches one web process serves at the same
time share one Redis write.

Each request still answers only after a write that holds its counts has succeeded, so what a router is told
was accepted is recorded (and a failed write fails every request it held, none of which was recorded: the
write is one Lua call, all or nothing). What changes is how many writes: while one write is in flight, the
requests that arrive meanwhile merge their counts into the next one, and the first of them to find no write
in flight sends it for all. A request that finds nothing in flight writes at once, so an idle hook waits
for nothing; under load each write carries several batches, and Redis adds to each (bucket, model) field
once per write instead of once per batch (batches for the same models add to the same fields).

Measured with `bench/hooks_load.py` (docs/web.md): batches of 1,000 events 587,000-681,000 events/s
against 383,000-396,000 writing each batch alone. Single events stay direct: merged, their server CPU per
request rose ~8 % (the thread hand-offs cost more than the round trip they save).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping

Counts = Mapping[float, Mapping[str, int]]  # {ts: {model: requests}}, as `traffic.record_counts` takes


class _Batch:
    __slots__ = ("counts", "now", "done", "error")

    def __init__(self) -> None:
        self.counts: dict[float, dict[str, int]] = {}
        self.now = 0.0
        self.done = False
        self.error: BaseException | None = None

    def add(self, counts: Counts, now: float) -> None:
        for ts, per_model in counts.items():
            into = self.counts.get(ts)
            if into is None:
                into = self.counts[ts] = {}
            for model, n in per_model.items():
                into[model] = into.get(model, 0) + n
        self.now = max(self.now, now)


class GroupCommit:
    """`record(counts, now)` writes through `write(counts, now)`, merged with the concurrent callers'."""

    def __init__(self, write: Callable[[Counts, float], object]) -> None:
        self._write = write
        self._cond = threading.Condition()
        self._pending: _Batch | None = None  # the batch the next write sends; callers merge into it
        self._writing = False

    def record(self, counts: Counts, now: float) -> int:
        """Returns the requests in `counts` once a write holding them succeeded; raises that write's error."""
        with self._cond:
            b = self._pending
            if b is None:
                b = self._pending = _Batch()
            b.add(counts, now)
            while self._writing and not b.done:
                self._cond.wait()
            lead = not b.done  # no write in flight and ours not sent: it is still the pending one; send it
            if lead:
                self._pending = None
                self._writing = True
        if lead:
            try:
                self._write(b.counts, b.now)
            except BaseException as exc:  # every caller merged into it gets the error
                b.error = exc
            with self._cond:
                b.done = True
                self._writing = False
                self._cond.notify_all()
        if b.error is not None:
            raise b.error
        return sum(n for per_model in counts.values() for n in per_model.values())


_by_client: weakref.WeakKeyDictionary[object, GroupCommit] = weakref.WeakKeyDictionary()
_by_client_lock = threading.Lock()


def for_client(client: object, write: Callable[[object, Counts, float], object]) -> GroupCommit:
    """The one GroupCommit of this process for `client` (a Redis client), made on first use."""
    gc = _by_client.get(client)
    if gc is None:
        with _by_client_lock:
            gc = _by_client.get(client)
            if gc is None:
                ref = weakref.ref(client)  # the value must not keep its key alive
                gc = _by_client[client] = GroupCommit(lambda counts, now: write(ref(), counts, now))
    return gc
