"""The worker's health file, and the checks `prewarm probe live|ready` make of it (Kubernetes exec probes).

The heartbeat thread rewrites `<data dir>/health/worker-<node>.json` at every beat, whether the beat reached
Redis or not, so a probe reads a local file and never needs Redis itself:
- live: the heartbeat thread is still beating (the file is fresh). A Redis outage or a failover does not make
  the worker unlive: restarting it would throw away its resident models.
- ready: the worker announced its GPUs (its Celery consumer is connected: `worker_ready`) and its last
  successful heartbeat is younger than the heartbeat TTL, i.e. the fleet sees it now.
A file left by an earlier container (a data folder on an emptyDir outlives a container restart) is stale
until the new worker's heartbeat starts, so it makes neither check pass.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Health:
    pid: int
    announced: bool  # the GPUs are announced: the consumer is connected (Celery's worker_ready)
    stopping: bool  # the worker is shutting down (or draining): not ready, still live
    beat_at: float  # wall-clock time of the last beat tried
    beat_ok_at: float | None  # ... and of the last one that reached Redis
    heartbeat_seconds: float
    heartbeat_ttl: float


def path_for(data_dir: Path, node: str) -> Path:
    return Path(data_dir) / "health" / f"worker-{re.sub(r'[^A-Za-z0-9._-]', '_', node)}.json"


def write(path: Path, health: Health) -> None:
    """Replace the file in one rename: a probe never reads half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")  # the heartbeat and worker_ready
    tmp.write_text(json.dumps(asdict(health)))
    os.replace(tmp, path)


def read(path: Path) -> Health:
    return Health(**json.loads(path.read_text()))


def live_problem(h: Health, now: float | None = None) -> str | None:
    """Why the worker is not live (None: it is)."""
    now = time.time() if now is None else now
    limit = max(3 * h.heartbeat_seconds, h.heartbeat_ttl)
    if now - h.beat_at > limit:
        why = "the worker has stopped" if h.stopping else "the worker is gone or its heartbeat thread is stuck"
        return f"no heartbeat tried for {now - h.beat_at:.0f} s (more than {limit:g} s): {why}"
    return None


def ready_problem(h: Health, now: float | None = None) -> str | None:
    """Why the worker is not ready (None: it is)."""
    now = time.time() if now is None else now
    if h.stopping:
        return "the worker is stopping"
    if (why := live_problem(h, now)) is not None:
        return why
    if not h.announced:
        return "the Celery consumer is not connected yet (GPUs not announced)"
    if h.beat_ok_at is None or now - h.beat_ok_at > h.heartbeat_ttl:
        return (f"no heartbeat reached Redis in the last {h.heartbeat_ttl:g} s (PREWARM_HEARTBEAT_TTL): "
                "the fleet does not see this worker")
    return None


def check(path: Path, what: str, now: float | None = None) -> str | None:
    """`what` = live | ready: the problem in one line, or None."""
    try:
        h = read(path)
    except FileNotFoundError:
        return f"{path} does not exist: the worker has not started its heartbeat (PREWARM_NODE, PREWARM_DATA_DIR?)"
    except (ValueError, TypeError) as exc:
        return f"{path} cannot be read ({exc})"
    return live_problem(h, now) if what == "live" else ready_problem(h, now)
