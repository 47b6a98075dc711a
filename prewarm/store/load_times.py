"""Measured load+warmup seconds per model: the worker records each preload, the scheduler plans with their
median and the API shows their p95, over the same most recent KEPT measurements. Beside them, the fleet's
delay before a demand load (keys.DEMAND_DELAYS): what a cold start took beyond its replica's own load and
warmup; the scheduler gives its median to the whole experts' shadows (Snapshot.demand_delay_s).

Loads from storage and promotions from a node's host cache (source "host") are kept apart, so a fast
promotion does not shorten the cold-load time the scheduler plans with.

Every push also bumps a version counter and notes the model's newest version in a change log
(keys.MEASURED_VERSION, keys.MEASURED_CHANGES), in the same atomic step: `Recent` keeps a reader's copy
of every model's measurements and re-reads only the models written since its last read (the scheduler's
tick at 10,000 models read 20,000 lists every tick before). Writers other than `push` are not seen by a
`Recent` that already holds the model.
"""

from __future__ import annotations

import statistics
import uuid
from dataclasses import dataclass, field

import redis
from redis.client import Pipeline

from prewarm import keys, state

KEPT = 20  # measurements kept per model and list: the most recent ones, newest first
KEPT_DELAYS = 50  # delays before a demand load kept, fleet-wide: the most recent ones, newest first


# KEYS: the list, keys.MEASURED_VERSION, keys.MEASURED_CHANGES. ARGV: the value, KEPT, the model, an epoch id
# (kept only if the counter has none yet). One script, so the list and its change log move together.
_PUSH_LUA = b"""
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
redis.call('HSETNX', KEYS[2], 'epoch', ARGV[4])
local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
redis.call('ZADD', KEYS[3], n, ARGV[3])
return n
"""
_push_script = redis.commands.core.Script(None, _PUSH_LUA)


def push(pipe: Pipeline, replica: state.Replica) -> None:
    """Queue the ready replica's load+warmup seconds on `pipe` (its list trimmed to KEPT)."""
    key = keys.promote_times(replica.model) if replica.source == "host" else keys.load_times(replica.model)
    total = (replica.load_seconds or 0.0) + (replica.warmup_seconds or 0.0)
    _push_script(keys=[key, keys.MEASURED_VERSION, keys.MEASURED_CHANGES],
                 args=[f"{total:.4f}", KEPT, replica.model, uuid.uuid4().hex], client=pipe)


def push_delay(pipe: Pipeline, seconds: float) -> None:
    """Queue one delay before a demand load on `pipe` (the list trimmed to KEPT_DELAYS)."""
    pipe.lpush(keys.DEMAND_DELAYS, f"{seconds:.4f}")
    pipe.ltrim(keys.DEMAND_DELAYS, 0, KEPT_DELAYS - 1)


def demand_delay(cold_start_s: float, replica: state.Replica) -> float | None:
    """The delay before `replica`'s load, given the cold start it closed: the cold start's seconds beyond the
    replica's own load and warmup. None when its load began before the first cold lookup (a load ahead, or one
    already under way: no delay of a demand load to learn from) or was not measured. It counts a wait in the
    worker's own queue too, which a shadow's load slots also model: that errs toward the real fleet."""
    if replica.load_seconds is None:
        return None
    delay = cold_start_s - replica.load_seconds - (replica.warmup_seconds or 0.0)
    return delay if delay >= 0.0 else None


def median_delay(raw: list[bytes]) -> float:
    """The median of the delays read (0.0 when none, or an entry is corrupt)."""
    nums = _numbers(raw)
    return statistics.median(nums) if nums else 0.0


@dataclass
class Measured:
    load: list[float] = field(default_factory=list)  # from storage, newest first
    promote: list[float] = field(default_factory=list)  # from a host cache, newest first


def _numbers(raw: list[bytes]) -> list[float]:
    try:
        return [float(x) for x in raw]
    except ValueError:
        return []  # a corrupt entry: read as unmeasured rather than fail the reader


# KEYS: the lists to read; ARGV[1]: how many of each. One command whatever the number of lists: at 20,000
# lists a pipeline of LRANGEs spent most of its time in redis-py packing and parsing 20,000 commands.
_READ_LUA = b"""
local out = {}
local n = tonumber(ARGV[1]) - 1
for i, k in ipairs(KEYS) do out[i] = redis.call('LRANGE', k, 0, n) end
return out
"""
_read_script = redis.commands.core.Script(None, _READ_LUA)


def recent(r: redis.Redis, models: list[str]) -> dict[str, Measured]:
    """model -> its most recent measurements (empty lists when never measured), in one round trip."""
    if not models:
        return {}
    lists: list[str] = []
    for m in models:
        lists += (keys.load_times(m), keys.promote_times(m))
    raw = _read_script(keys=lists, args=[KEPT], client=r)
    return {m: Measured(_numbers(raw[2 * i]), _numbers(raw[2 * i + 1])) for i, m in enumerate(models)}


class Recent:
    """A reader's copy of `recent` for every model it is asked about, kept current by reading only what
    changed: one round trip for the change log, and one more for the lists of the models written since the
    last read (and of models asked about for the first time), if any. A Redis whose counter went back or
    whose epoch changed (wiped, or another server) is read in full again."""

    def __init__(self) -> None:
        self._measured: dict[str, Measured] = {}
        # model -> the medians of its lists as last read (load, promote; None: none measured), dropped with them
        self._medians: dict[str, tuple[float | None, float | None]] = {}
        self._epoch: bytes | None = None
        self._n = 0
        # the last medians() answer and the list it answered: the next answer for the same list is a copy with the
        # models read anew since brought up to date (the same two dicts when none was)
        self._last: tuple[list[str], dict[str, float], dict[str, float]] | None = None
        # the models the last medians() answer computed anew (None: all of them, a new list or a new reader)
        self.fresh: list[str] | None = None
        self._need: list[str] = []
        self.delay = 0.0  # median_delay of keys.DEMAND_DELAYS at the last read

    def _refresh(self, r: redis.Redis, models: list[str]) -> None:
        pipe = r.pipeline(transaction=True)  # the counter and the log at one instant
        pipe.hmget(keys.MEASURED_VERSION, ["epoch", "n"])
        pipe.zrangebyscore(keys.MEASURED_CHANGES, f"({self._n}", "+inf")
        pipe.lrange(keys.DEMAND_DELAYS, 0, KEPT_DELAYS - 1)  # (in the same round trip)
        (epoch, n_raw), changed, delays = pipe.execute()
        self.delay = median_delay(delays)
        n = int(n_raw or 0)
        if epoch != self._epoch or n < self._n:
            self._measured, self._medians, changed = {}, {}, []  # another counter's life: nothing held is current
        for m in changed:  # written since: forgotten, whether or not asked about now
            self._measured.pop(m.decode(), None)
        need = [m for m in models if m not in self._measured]
        self._need = need
        if need:
            # Read after the log: a push between the two lands here or shows in the next read's log.
            self._measured.update(recent(r, need))
            for m in need:  # (a model's medians are kept only while its lists are)
                self._medians.pop(m, None)
        self._epoch, self._n = epoch, n

    def read(self, r: redis.Redis, models: list[str]) -> dict[str, Measured]:
        self._refresh(r, models)
        return {m: self._measured[m] for m in models}

    def medians(self, r: redis.Redis, models: list[str]) -> tuple[dict[str, float], dict[str, float]]:
        """median_seconds(self.read(r, models)), each model's computed once per reading of its lists (not
        10,000 medians every tick). Asked again for the same `models` list, only the models read anew since are
        looked at (`fresh` names them), and with none the same two dicts come back: they are shared, not to be
        changed."""
        self._refresh(r, models)
        last = self._last
        todo: list[str]
        if last is not None and last[0] is models:
            if not self._need:
                self.fresh = []
                return last[1], last[2]
            load, promote = dict(last[1]), dict(last[2])
            todo = self.fresh = self._need
        else:
            load, promote = {}, {}
            todo, self.fresh = models, None
        cache = self._medians
        for m in todo:
            got = cache.get(m)
            if got is None:
                one_load, one_promote = median_seconds({m: self._measured[m]})
                got = cache[m] = (one_load.get(m), one_promote.get(m))
            for out, v in ((load, got[0]), (promote, got[1])):
                if v is None:
                    out.pop(m, None)
                else:
                    out[m] = v
        self._last = (models, load, promote)
        return load, promote


def median_seconds(measured: dict[str, Measured]) -> tuple[dict[str, float], dict[str, float]]:
    """Median of the recent loads from storage and of the promotions from a host cache, per model (a model
    never measured, or with a corrupt entry, is absent): what the scheduler plans with and the route hook's
    ETA promises."""
    load: dict[str, float] = {}
    promote: dict[str, float] = {}
    for m, x in measured.items():
        for out, nums in ((load, x.load), (promote, x.promote)):
            if nums:
                out[m] = statistics.median(nums)
    return load, promote


def medians(r: redis.Redis, models: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """`median_seconds` of the models' measurements, read in one round trip."""
    return median_seconds(recent(r, models))
