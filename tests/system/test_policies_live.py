"""PREWARM_POLICY: the live scheduler runs prewarm's plan or a baseline's rule through the same
snapshot → actions → dispatch path (real Redis, heartbeat records as a worker writes them, tasks read
from the GPUs' Celery queues). The process-level run with a real worker is in test_policies_system.py."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from gpu_worker.sized_catalog import write_sized_catalog
from prewarm import events, keys, state, traffic
from prewarm.config import Settings
from prewarm.context import Context
from prewarm.domain import policy_names
from prewarm.domain.baselines import RULES
from prewarm.domain.baselines.live import BaselinePolicy
from prewarm.domain.choice import make_policy
from prewarm.domain.policy import GpuState, ModelSpec, PolicyConfig, ReplicaState, Snapshot, TrafficHistory
from prewarm.store import cold_starts
from scheduler.live import Scheduler
from tests.web_support import publish_gpu, queued_tasks, replica

MIB = 1024**2
REPO = Path(__file__).resolve().parents[2]


def context(redis_url: str, tmp_path: Path, policy: str | None) -> Context:
    catalog = tmp_path / "models" / "catalog.toml"
    if not catalog.exists():
        catalog = write_sized_catalog(tmp_path / "models", {"a": 40 * MIB, "b": 40 * MIB, "c": 40 * MIB})
    env = {"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PREWARM_LEADER_TTL": "1",
           "PREWARM_DATA_DIR": str(tmp_path / "var")}
    if policy is not None:
        env["PREWARM_POLICY"] = policy
    return Context(Settings.from_env(env), start_redis=False)


def test_policy_setting_defaults_to_prewarm_and_names_the_allowed_values() -> None:
    assert Settings.from_env({}).policy == "prewarm"
    for name in policy_names.LIVE_POLICIES:
        assert Settings.from_env({"PREWARM_POLICY": name}).policy == name
        assert make_policy(name, PolicyConfig()).name == name
    with pytest.raises(ValueError) as err:
        Settings.from_env({"PREWARM_POLICY": "lru"})
    msg = str(err.value)
    assert "PREWARM_POLICY='lru'" in msg
    assert all(name in msg for name in policy_names.LIVE_POLICIES)
    # every live baseline has a rule, and the simulator runs the same classes
    from simulator.policies import POLICIES

    for name in policy_names.LIVE_POLICIES[1:]:
        assert POLICIES[name] is RULES[name]


def test_the_baselines_rules_import_no_simulator_redis_or_torch() -> None:
    code = ("import sys, prewarm.domain.baselines, prewarm.domain.choice;"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('simulator', 'redis', 'celery', 'torch', "
            "'flask'));print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_on_demand_lru_live_makes_room_by_evicting_the_least_recently_requested(redis_url, r, tmp_path) -> None:
    # One 100 MiB GPU holding a (loaded first) and b; the router then reports requests for a, and looks c up
    # cold (no room: the route hook can place nothing). LRU by load age would evict a; by requests, b.
    ctx = context(redis_url, tmp_path, "on-demand-lru")
    now = time.time()
    gid = "node-a/cpu:0"
    publish_gpu(r, gid, total_mib=100, replicas=[replace(replica("a", gid, mib=40), created_at=now - 60),
                                                 replace(replica("b", gid, mib=40), created_at=now - 30)])
    traffic.record(r, [("a", 3, now - 5)], now=now)  # seconds old enough for the tick's read
    sched = Scheduler(ctx, ident="s-lru")
    assert sched.tick(now).leader and sched.tick(now).dispatched == 0  # room enough, nobody waits
    cold_starts.open_episode(r, "c", "v1", now)
    res = sched.tick(now + 1)
    assert res.dispatched == 2, res
    # (the Redis transport pushes on the left: the list is newest first)
    tasks = [(t["headers"]["task"].rsplit(".", 1)[-1], t["headers"]["argsrepr"]) for t in
             reversed(queued_tasks(r, state.queue_name("node-a", "cpu:0")))]
    assert [name for name, _ in tasks] == ["evict", "preload"], tasks
    assert "'b'" in tasks[0][1] and "'c'" in tasks[1][1], tasks
    ev = events.read(r, kind="evict")[0]
    assert ev.model == "b" and ev.actor == "scheduler" and ev.reason.startswith("on-demand-lru: making room for c")
    assert r.hget(keys.SCHEDULER_STATUS, "policy") == b"on-demand-lru"


def test_a_scheduler_starting_with_another_policy_records_the_change(redis_url, r: redis.Redis, tmp_path) -> None:
    publish_gpu(r, "node-a/cpu:0", total_mib=100)
    first = Scheduler(context(redis_url, tmp_path, None), ident="s-old")
    assert first.tick().leader
    assert not events.read(r, kind="policy")  # nothing recorded before: no change
    first.leadership.release()
    again = Scheduler(context(redis_url, tmp_path, None), ident="s-same")
    assert again.tick().leader
    assert not events.read(r, kind="policy")  # the same policy again is no change
    again.leadership.release()
    changed = Scheduler(context(redis_url, tmp_path, "faascache"), ident="s-new")
    assert changed.tick().leader
    (ev,) = events.read(r, kind="policy")
    assert ev.actor == "operator" and ev.numbers == {"from": "prewarm", "to": "faascache", "scheduler": "s-new"}
    assert "from prewarm to faascache" in ev.reason


def _snap(now: float, replicas: tuple[ReplicaState, ...], history: TrafficHistory,
          waiting: dict[str, int] | None = None) -> Snapshot:
    models = {m: ModelSpec(m, 40 * MIB) for m in ("a", "b")}
    gpus = (GpuState("n/cpu:0", "n", 100 * MIB, 100 * MIB - sum(x.bytes for x in replicas)),)
    return Snapshot(models, gpus, replicas, history, waiting=waiting or {}, config=PolicyConfig())


def test_keepalive_live_unloads_a_model_idle_for_ten_minutes_of_its_reported_requests() -> None:
    # The rule's own timer runs on the scheduler's clock: armed at a's last reported request while ready,
    # and due 600 s later; a request at +300 s re-arms it, so the unload comes at +900 s, not +600 s.
    pol = BaselinePolicy("keepalive-10m", RULES["keepalive-10m"](), PolicyConfig())
    hist = TrafficHistory.for_config(PolicyConfig())
    t0 = 1_000_000.0
    ready = (ReplicaState("a", "n/cpu:0", "ready", 40 * MIB, t0 - 5),)
    assert pol.decide(_snap(t0, ready, hist), t0, [("a", t0 - 1, 1)]) == []
    assert pol.decide(_snap(t0 + 300, ready, hist), t0 + 300, [("a", t0 + 299, 1)]) == []
    assert pol.decide(_snap(t0 + 700, ready, hist), t0 + 700) == []
    (ev,) = pol.decide(_snap(t0 + 901, ready, hist), t0 + 901)
    assert (type(ev).__name__, ev.model, ev.kind) == ("Evict", "a", "quiet")


def test_a_baseline_live_loads_a_waiting_model_once_while_its_load_is_in_flight() -> None:
    pol = BaselinePolicy("faascache", RULES["faascache"](), PolicyConfig())
    hist = TrafficHistory.for_config(PolicyConfig())
    t0 = 1_000_000.0
    (load,) = pol.decide(_snap(t0, (), hist, {"b": 1}), t0, [("b", t0 - 1, 1)])
    assert (type(load).__name__, load.model, load.gpu, load.kind) == ("Preload", "b", "n/cpu:0", "demand")
    loading = (ReplicaState("b", "n/cpu:0", "loading", 40 * MIB, t0),)
    assert pol.decide(_snap(t0 + 1, loading, hist, {"b": 1}), t0 + 1) == []  # in flight: no second load
