"""The failover bench: a loopback Sentinel setup, prewarm's processes on its sentinel:// URL, N failovers.

    Redis    a master, two replicas, three sentinels (quorum 2, down after 1 s): after each kill one replica is
             left to confirm the hook's writes (PREWARM_REDIS_WAIT_REPLICAS=1), and the killed node comes back
             as a replica before the next kill
    prewarm  `prewarm web` (1 gunicorn worker), two `prewarm scheduler`s, one `prewarm worker` (two CPU
             virtual GPUs), heartbeat 0.5 s / TTL 3 s, tick 0.5 s, leader lock TTL 2 s
    load     hook threads posting single events for two models, and `preload_pairs` (model, GPU) pairs, each
             preloaded by the operator path (the dispatcher), waited for, evicted, again and again

Per failover: the election (kill to a new master answering), the seconds until the fleet view is whole
again (both GPUs announced by the same worker process), the schedulers holding the leader lock after the
hold (sampled for a second). Over the run: worker process restarts (the PID; goal 0) and consumer restarts
inside it, hook events answered 202 against what Redis counted, preloads sent against those seen ready on
their GPU; anything lost is described in `lost_detail`.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from prewarm import events, keys, state
from prewarm.config import Settings, repo_root
from prewarm.context import Context
from prewarm.dispatch import order_preload
from prewarm.domain import states as rs
from prewarm.redis_server import free_port
from prewarm.sentinel_cluster import SentinelCluster

HOT = ["tiny-mlp", "tiny-lm@v2"]  # hook traffic ("id@version" picks the demo model)
PRELOADED = ["tiny-lm", "tiny-sharded", "tiny-sharded3", "tiny-lm-bf16"]
DEVICES = ["cpu:0", "cpu:1"]
LOST_AFTER_S = 45.0  # a preload not ready this long after it was sent is lost
HEARTBEAT_TTL = 3.0


def _catalog(folder: Path) -> Path:
    from gpu_worker.demo_models import SMALL, catalog_entry, write_weights

    wanted = {tuple(m.split("@")) if "@" in m else (m, "v1") for m in [*HOT, *PRELOADED]}
    parts = []
    for m in SMALL:
        if (m.id, m.version) in wanted:
            rel = f"{m.id}-{m.version}"
            parts.append(catalog_entry(m, f"{rel}/{write_weights(m, folder / rel)}"))
    path = folder / "catalog.toml"
    path.write_text("\n".join(parts))
    return path


class Procs:
    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work, self.env = work, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(self.work / f"{name}.log", "wb") as out:
            p = subprocess.Popen([sys.executable, "-m", "prewarm.programs.cli", *args], env={**self.env, **(env or {})},
                                 cwd=repo_root(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        self.procs[name] = p
        return p

    def log(self, name: str) -> str:
        p = self.work / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def stop(self) -> None:
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


class Hooks(threading.Thread):
    def __init__(self, port: int, model: str) -> None:
        super().__init__(daemon=True)
        self.port, self.model = port, model
        self.accepted = self.refused = 0
        self.halt = threading.Event()

    def run(self) -> None:
        body = json.dumps({"model": self.model}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        while not self.halt.is_set():
            try:
                conn.request("POST", "/hooks/requests", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
            except OSError:  # unanswered: not accepted; resent
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                self.halt.wait(0.05)
                continue
            if resp.status == 202:
                self.accepted += 1
            else:
                self.refused += 1
                self.halt.wait(min(0.2, float(resp.getheader("Retry-After") or 0.1)))
            self.halt.wait(0.005)  # a steady stream, not a flood of a 2-core machine
        conn.close()


@dataclass
class Sent:
    model: str
    gpu: str
    at: float
    intent_id: str
    task_id: str
    done_at: float | None = None


@dataclass
class PreloadStream:
    ctx: Context
    pairs: list[tuple[str, str]]
    sent: list[Sent] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    halt: threading.Event = field(default_factory=threading.Event)

    def run_pair(self, model: str, gpu: str) -> None:
        version = "v1"
        while not self.halt.is_set():
            try:
                fleet = state.read_fleet(self.ctx.r)
                g = fleet.gpu(gpu)
                here = [x for x in fleet.replicas(model) if x.gpu == gpu]
                if g is None:
                    self.halt.wait(0.2)
                    continue
                if here:
                    if here[0].state == rs.READY:
                        self.ctx.dispatcher.evict(model, version, g, actor="operator", kind="bench",
                                                  reason="bench failover: evicted to preload again")
                    self.halt.wait(0.2)
                    continue
                [d] = self.ctx.dispatcher.send_many([order_preload(model, version, g, actor="operator", kind="bench",
                                                                   reason="bench failover: the preload stream")])
                if isinstance(d, Exception) or not d.sent:
                    self.halt.wait(0.2)
                    continue
                s = Sent(model, gpu, time.time(), d.intent_id, d.task_id)
                self.sent.append(s)
                deadline = time.monotonic() + LOST_AFTER_S
                while time.monotonic() < deadline:  # even once halted: a preload sent is waited for
                    with contextlib.suppress(redis.RedisError):
                        if any(x.gpu == gpu and x.state == rs.READY for x in state.read_fleet(self.ctx.r).replicas(model)):
                            s.done_at = time.time()
                            break
                    time.sleep(0.05)
            except redis.RedisError:  # the election window: try again
                self.halt.wait(0.2)
            except Exception as exc:  # noqa: BLE001 - the bench reports, it does not stop
                self.errors.append(f"{model} on {gpu}: {type(exc).__name__}: {exc}")
                self.halt.wait(0.5)


def _retry(fn: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _fleet_whole(r: redis.Redis, gpus: list[str], pid: int) -> bool:
    try:
        fleet = state.read_fleet(r)
        alive = {g.id for g in fleet.alive()}
        owners = [r.hget(keys.gpu(g), "worker") for g in gpus]
    except redis.RedisError:
        return False
    return set(gpus) <= alive and all(o is not None and f":{pid}:" in o.decode() for o in owners)


def _wait(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench failover: {what} did not happen within {timeout:g} s")
        time.sleep(0.05)


def run_bench(failovers: int = 5, *, preload_pairs: int = 4, hook_threads: int = 2, settle: float = 4.0,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    if failovers < 1:
        raise ValueError("--failovers: at least 1")
    if preload_pairs < 0 or hook_threads < 0 or not 0 <= settle < math.inf:
        raise ValueError("--preload-pairs, --hook-threads and --settle: 0 or more (0 pairs or threads: that "
                         "traffic is left out)")
    work = Path(tempfile.mkdtemp(prefix="prewarm-bench-failover-"))
    catalog = _catalog(work / "models")
    cluster = SentinelCluster(replicas=2).start()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env.update({"PREWARM_REDIS_URL": cluster.url, "PREWARM_CATALOG": str(catalog), "PREWARM_NODE": "bench",
                "PREWARM_DEVICES": ",".join(f"{d}=256MiB" for d in DEVICES), "PORT": str(port),
                "PREWARM_DATA_DIR": str(work / "data"), "PREWARM_HEARTBEAT_SECONDS": "0.5",
                "PREWARM_HEARTBEAT_TTL": str(HEARTBEAT_TTL), "PREWARM_TICK_SECONDS": "0.5",
                "PREWARM_LEADER_TTL": "2", "PREWARM_HOST_CACHE": "0",
                # no speculative fill: the scheduler would load (and evict) the preload stream's models too
                "PREWARM_SPECULATIVE_SHARE": "0", "PREWARM_REDIS_WAIT_REPLICAS": "1",
                "PREWARM_LOAD_THREADS": "2", "PREWARM_WARMUP_MAX_PASSES": "4",
                "PROMETHEUS_MULTIPROC_DIR": str(work / "prom"), "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": str(repo_root())})
    (work / "prom").mkdir()
    procs = Procs(work, env)
    keep_logs = True  # until the run ends clean
    hooks: list[Hooks] = []
    stream: PreloadStream | None = None
    threads: list[threading.Thread] = []
    try:
        ctx = Context(Settings.from_env(env), start_redis=False)
        r = ctx.r
        log(f"bench failover: Redis through {cluster.url}; starting web, worker and two schedulers")
        procs.start("web", "web", "--host", "127.0.0.1", "--workers", "1")
        worker = procs.start("worker", "worker", "--loglevel", "INFO")
        gpus = [state.gpu_id("bench", d) for d in DEVICES]
        _wait(lambda: _fleet_whole(r, gpus, worker.pid), 180, "the worker's GPUs heartbeating")
        schedulers = [procs.start(f"scheduler-{i}", "scheduler") for i in range(2)]
        idents = {f"{os.uname().nodename}:{p.pid}".encode() for p in schedulers}
        _wait(lambda: _retry(lambda: r.get(keys.LEADER_LOCK)) in idents, 60, "a scheduler to lead")
        _wait(lambda: _web_up(port), 120, "the web answering")

        hooks = [Hooks(port, HOT[i % len(HOT)].split("@")[0]) for i in range(hook_threads)]
        models = [m.split("@")[0] for m in PRELOADED]
        pairs = [(models[i % len(models)], gpus[i % len(gpus)]) for i in range(preload_pairs)]
        stream = PreloadStream(ctx, pairs)
        threads = [threading.Thread(target=stream.run_pair, args=p, daemon=True) for p in pairs]
        for t in [*hooks, *threads]:
            t.start()

        elections, whole, leaders, kills = [], [], [], []
        for n in range(failovers):
            time.sleep(settle)
            old = cluster.kill_master()
            killed = time.monotonic()
            kills.append(time.time())
            elections.append(cluster.wait_failover(old))
            _wait(lambda: _fleet_whole(r, gpus, worker.pid), 120, "the fleet view to be whole again")
            whole.append(time.monotonic() - killed)
            time.sleep(max(0.0, HEARTBEAT_TTL + 0.5 - (time.monotonic() - killed)))  # past the hold
            leaders.append(_leaders(r, idents))
            log(f"failover {n + 1}/{failovers}: elected in {elections[-1]:.2f} s, fleet whole after {whole[-1]:.2f} s, "
                f"{leaders[-1]} leader(s); hooks {sum(h.accepted for h in hooks)} accepted, preloads "
                f"{len(stream.sent)} sent")
            cluster.restart(old)

        time.sleep(settle)
        stream.halt.set()
        for t in threads:
            t.join(LOST_AFTER_S + 5)
        for h in hooks:
            h.halt.set()
            h.join(10)
        counted = _retry(lambda: r.hgetall(keys.REQUESTS_TOTAL))
        recorded = {k.decode(): int(v) for k, v in counted.items()}
        answered = {h.model: 0 for h in hooks}
        for h in hooks:
            answered[h.model] += h.accepted
        lost_hooks = sum(max(0, answered[m] - recorded.get(m, 0)) for m in answered)
        log_text = procs.log("worker")
        failover_events = [e for e in _retry(lambda: events.read(r, limit=5000)) if e.kind == "failover"]
        handled = [x for e in failover_events for x in (e.numbers.get("resent") or [])]
        resent = sum(x.startswith("sent again") for x in handled)
        lost = [s for s in stream.sent if s.done_at is None]
        trouble = bool(lost) or lost_hooks > 0 or worker.poll() is not None or "Unrecoverable error" in log_text
        keep_logs = trouble
        return {
            "failovers": failovers,
            "settings": {"replicas": len(cluster.nodes) - 1, "sentinels": len(cluster.sentinels),
                         "heartbeat_ttl": HEARTBEAT_TTL, "wait_replicas": 1, "preload_pairs": preload_pairs,
                         "hook_threads": hook_threads},
            "election_seconds": [round(x, 3) for x in elections],
            "election_seconds_p50": round(statistics.median(elections), 3),
            "fleet_whole_seconds": [round(x, 3) for x in whole],
            "leaders_after_failover": leaders,
            "worker_restarts": 0 if worker.poll() is None else 1,
            "consumer_restarts": len(re.findall(r"Celery consumer failed", log_text)),
            "worker_unrecoverable_errors": log_text.count("Unrecoverable error"),
            "hooks": {"answered_202": sum(answered.values()), "recorded": sum(recorded.get(m, 0) for m in answered),
                      "lost": lost_hooks, "answered_503": sum(h.refused for h in hooks)},
            "preloads": {"sent": len(stream.sent), "completed": len(stream.sent) - len(lost),
                         "resent_after_failover": resent, "released_after_failover": len(handled) - resent,
                         "lost": len(lost),
                         "lost_detail": [_describe(r, s, kills) for s in lost], "errors": stream.errors[:20]},
            "failover_events": len(failover_events),
            "logs": str(work) if trouble else None,  # kept only when something was lost or failed
        }
    finally:
        if stream is not None:
            stream.halt.set()
        for h in hooks:
            h.halt.set()
        procs.stop()
        cluster.stop()
        if not keep_logs:
            shutil.rmtree(work, ignore_errors=True)


def _web_up(port: int) -> bool:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request("GET", "/healthz")
        return c.getresponse().status == 200
    except OSError:
        return False


def _leaders(r: redis.Redis, idents: set[bytes]) -> int:
    """Schedulers holding the leader lock over one second (sampled): 1 when one leads throughout."""
    seen = set()
    for _ in range(10):
        with contextlib.suppress(redis.RedisError):
            seen.add(r.get(keys.LEADER_LOCK))
        time.sleep(0.1)
    return len({s for s in seen if s in idents}) if None not in seen else len(seen - {None}) or 0


def _describe(r: redis.Redis, s: Sent, kills: list[float]) -> dict[str, Any]:
    """What became of a preload that never came ready: when it was sent against the kills, its intent now,
    the replica on its GPU now, and the events for the model on that GPU since."""
    try:
        held = state.held_intent(r, s.model, s.gpu)
        fleet = state.read_fleet(r)
        evs = [e for e in events.read(r, limit=5000, model=s.model) if e.gpu == s.gpu and e.ts >= s.at - 1]
    except redis.RedisError as exc:
        return {"model": s.model, "gpu": s.gpu, "error": str(exc)}
    nearest = min(kills, key=lambda k: abs(k - s.at)) if kills else None
    return {"model": s.model, "gpu": s.gpu, "intent_id": s.intent_id, "task_id": s.task_id,
            "sent_seconds_from_nearest_kill": None if nearest is None else round(s.at - nearest, 3),
            "intent_now": None if held is None else {"id": held.id, "action": held.action, "actor": held.actor},
            "replica_now": [x.state for x in fleet.replicas(s.model) if x.gpu == s.gpu],
            "events": [f"{e.kind} {e.actor}: {e.reason}"[:200] for e in reversed(evs[:8])]}  # oldest first
