"""GPU memory-time held per model (keys.memory_minute): the leader scheduler accounts the fleet it read
each tick, so /api/roi can say what keeping a model warm cost over a window.

A replica holding memory (any state but failed) counts its bytes (measured, or its full size while
loading) × the seconds since the previous account, at most MAX_GAP_S (a pause in leadership is not
guessed at), as byte-seconds and as GPU-seconds (bytes / the GPU's total).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

import redis

from prewarm import keys, state
from prewarm.domain import states as rs
from prewarm.domain.slo import minute_of
from prewarm.store import minute_hashes

MAX_GAP_S = 30.0


def account(r: redis.Redis, fleet: state.Fleet, since: float | None, now: float) -> None:
    """Add memory-time from `since` (the last account; None: the first, nothing to add) to `now`."""
    if since is None or now <= since:
        return
    dt = min(now - since, MAX_GAP_S)
    per_bytes: dict[str, float] = defaultdict(float)
    per_gpu: dict[str, float] = defaultdict(float)
    for g in fleet.alive():
        for x in g.replicas:
            if x.state not in rs.HOLDING:
                continue
            held = max(x.bytes, x.total_bytes)
            per_bytes[x.model] += held * dt
            per_gpu[x.model] += (held / g.total_bytes if g.total_bytes else 0.0) * dt
    if not per_bytes:
        return
    # One command with one JSON argument, not two HINCRBYFLOATs per model: at 10,000 models × 256 GPUs the
    # pipeline's packing was a good part of the scheduler's tick.
    fields: dict[str, str] = {}
    for model, v in per_bytes.items():
        fields[f"bytes:{model}"] = repr(v)
        fields[f"gpu:{model}"] = repr(per_gpu[model])
    _add_script(keys=[keys.memory_minute(minute_of(now))], args=[json.dumps(fields), keys.MINUTE_TTL_S], client=r)


# KEYS[1]: the minute's hash; ARGV[1]: JSON {field: increment as a string}; ARGV[2]: its TTL in seconds.
# (Increments as strings: HINCRBYFLOAT reads them exactly as redis-py would have sent them.)
_ADD_LUA = b"""
for f, v in pairs(cjson.decode(ARGV[1])) do redis.call('HINCRBYFLOAT', KEYS[1], f, v) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""
_add_script = redis.commands.core.Script(None, _ADD_LUA)


@dataclass
class Held:
    byte_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    gpu_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))


def read_window(r: redis.Redis, now: float, seconds: float) -> Held:
    """Per model, memory-time over the window's minutes (as lookup_counts.read_window), one round trip."""
    out = Held()
    for what, model, v in minute_hashes.read_fields(r, keys.memory_minute, now, seconds):
        (out.byte_seconds if what == "bytes" else out.gpu_seconds)[model] += float(v)
    return out
