"""The scheduler's snapshot reads only what changed since its last tick, and plan() gets the same snapshot a
full read would give.

A long-lived SnapshotReader (load times kept in prewarm.store.load_times.Recent, re-read only for models
measured since) is compared with a full read after each of a series of real writes of every kind the
snapshot holds: heartbeats with replicas, measured loads and promotions (as the worker records them),
pins, rollouts, intents through the dispatcher, cold starts, host caches, catalog edits, and a wiped Redis.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import redis

from gpu_worker.sized_catalog import write_sized_catalog
from prewarm import keys, state, traffic
from prewarm.catalog import load_catalog
from prewarm.catalog_entries import Catalog
from prewarm.config import Settings
from prewarm.context import Context
from prewarm.domain.policy import PolicyConfig, Snapshot
from prewarm.redis_round_trips import count_round_trips
from prewarm.store import cold_starts, load_times, overlays
from prewarm.store.ready import replica_ready
from scheduler.snapshot import SnapshotReader

MIB = 1024**2
GIB = 1024**3
GPU = "node-a/cpu:0"


def catalog(folder: Path, names: list[str]) -> Catalog:
    return load_catalog(write_sized_catalog(folder, {n: 8 * MIB for n in names}))


def heartbeat(r: redis.Redis, replicas: list[state.Replica]) -> state.Gpu:
    used = sum(x.bytes for x in replicas)
    g = state.Gpu(id=GPU, node="node-a", device="cpu:0", queue=state.queue_name("node-a", "cpu:0"),
                  total_bytes=GIB, used_bytes=used, free_bytes=GIB - used, last_heartbeat=time.time(),
                  started_at=time.time() - 3600)
    state.write_heartbeat(r, g, replicas, ttl=60)
    return g


def ready(model: str, load_s: float, *, version: str = "v1", source: str = "storage") -> state.Replica:
    now = time.time()
    return state.Replica(model=model, version=version, gpu=GPU, state="ready", bytes=8 * MIB, total_bytes=8 * MIB,
                         progress=1.0, load_seconds=load_s, warmup_seconds=0.5, since=now - 60,
                         created_at=now - 70, source=source)


def without_traffic(snap: Snapshot) -> Snapshot:
    # Both readers feed their traffic history from the same buckets; the rest must be equal field by field.
    return dataclasses.replace(snap, traffic=None)


def test_incremental_snapshot_equals_a_full_read_after_writes_of_every_kind(redis_url: str, tmp_path: Path) -> None:
    r = redis.Redis.from_url(redis_url)
    ctx = Context(Settings.from_env({"PREWARM_REDIS_URL": redis_url, "PREWARM_DATA_DIR": str(tmp_path / "var"),
                                     "PREWARM_CATALOG": str(tmp_path / "none.toml")}))
    base = catalog(tmp_path / "c1", ["hot", "quiet", "other", "chat", "chat@v2"])
    config = PolicyConfig()
    incremental = SnapshotReader(r, config)
    reads = 0

    def check(cat: Catalog) -> Snapshot:
        nonlocal reads
        now = time.time()
        inc, _ = incremental.read(cat, now)
        full, _ = SnapshotReader(r, config).read(cat, now, full=True)
        assert without_traffic(inc) == without_traffic(full)
        reads += 1
        return inc

    heartbeat(r, [ready("hot", 2.0)])
    replica_ready(r, ready("hot", 2.0))
    traffic.record(r, [("hot", 3, time.time() - 30)])
    first = check(base)
    assert first.models["hot"].load_seconds == pytest.approx(2.5)  # load + warmup, as the worker measures
    # Loads and promotions measured (a model the reader holds, and one it never saw measured).
    for s in (4.0, 6.0):
        replica_ready(r, ready("hot", s))
    replica_ready(r, ready("quiet", 1.0, source="host"))
    snap = check(base)
    assert snap.models["hot"].load_seconds == pytest.approx(4.5) and snap.models["quiet"].promote_seconds == 1.5
    # Fleet, pins, rollouts, intents, cold starts and a host cache.
    g = heartbeat(r, [ready("hot", 2.0), ready("other", 1.0)])
    overlays.set_pinned(r, "other", True)
    overlays.announce(r, "chat", overlays.Rollout(version="v2", traffic_fraction=0.25, since=time.time()))
    assert ctx.dispatcher.preload("chat", "v2", g, actor="test", reason="rollout").sent
    cold_starts.open_episode(r, "quiet", "v1")
    state.write_node(r, state.Node(node="node-a", budget_bytes=GIB, used_bytes=0, free_bytes=GIB,
                                   last_heartbeat=time.time()), [], ttl=60)
    snap = check(base)
    assert snap.intents and snap.waiting == {"quiet": 1} and snap.models["other"].pinned
    # A model measured while out of the catalog, then back in it: its new times, not what was held.
    smaller = catalog(tmp_path / "c2", ["hot", "other", "chat", "chat@v2"])
    check(smaller)
    replica_ready(r, ready("quiet", 9.0))
    check(smaller)
    assert check(base).models["quiet"].load_seconds == pytest.approx(9.5)
    # A cold start that began 20 s before its replica turned ready, whose load and warmup took 2.5 s: a delay of
    # 17.5 s before that demand load, the fleet's median with no other
    assert check(base).demand_delay_s == 0.0
    cold_starts.open_episode(r, "other", "v1", time.time() - 80)
    replica_ready(r, ready("other", 2.0))  # (ready 60 s ago)
    assert check(base).demand_delay_s == pytest.approx(17.5, abs=0.01)
    # Redis wiped and measured again: nothing held from before counts.
    r.flushall()
    heartbeat(r, [])
    r.lpush(keys.load_times("hot"), "7.0000")  # (not through push: only a full read can see it)
    snap = check(base)
    assert snap.models["hot"].load_seconds == pytest.approx(7.0) and snap.models["quiet"].load_seconds is None
    assert snap.demand_delay_s == 0.0
    replica_ready(r, ready("hot", 0.5))
    assert check(base).models["hot"].load_seconds == pytest.approx(4.0)  # median of 7.0 and 1.0
    assert reads == 10
    r.close()


def test_a_tick_with_nothing_measured_reads_no_load_times(redis_url: str, tmp_path: Path) -> None:
    """The change log is read in one round trip; the lists only for the models written since."""
    r = redis.Redis.from_url(redis_url)
    trips = count_round_trips(r)
    names = [f"m{i}" for i in range(50)]
    recent = load_times.Recent()
    replica_ready(r, ready("m3", 2.0))
    assert recent.read(r, names)["m3"].load == [2.5]
    before = trips.value
    assert recent.read(r, names)["m3"].load == [2.5]
    assert trips.value - before == 1  # the change log only: nothing written since
    replica_ready(r, ready("m7", 1.0))
    r.config_resetstat()
    got = recent.read(r, names)
    # Redis's own count: the two lists of m7 (storage loads and promotions), none of the other 49 models', and the
    # fleet's delays before a demand load (read in the change log's round trip)
    assert r.info("commandstats")["cmdstat_lrange"]["calls"] == 3
    assert got == load_times.recent(r, names) and got["m7"].load == [1.5] and got["m3"].load == [2.5]
    # the medians it keeps are those of what it read, and a new measurement moves them
    assert recent.medians(r, names) == load_times.median_seconds(got) == ({"m3": 2.5, "m7": 1.5}, {})
    replica_ready(r, ready("m7", 3.0))
    assert recent.medians(r, names) == ({"m3": 2.5, "m7": 2.5}, {})  # median of 1.5 and 3.5
    r.close()


def _history_state(h: object) -> list[tuple[str, int, tuple[object, ...]]]:
    """Everything a TrafficHistory holds per model, in its order of last change."""
    import ast

    import prewarm.domain.policy

    # The per-model slots, from the source (the native build's classes do not list them).
    src = ast.parse((Path(prewarm.domain.policy.__file__).parent / "history.py").read_text())
    cls = next(n for n in src.body if isinstance(n, ast.ClassDef) and n.name == "_ModelTraffic")
    slots = next(ast.literal_eval(a.value) for a in cls.body if isinstance(a, ast.Assign)
                 and getattr(a.targets[0], "id", "") == "__slots__")
    models = h._m  # type: ignore[attr-defined]
    return [(m, seq, tuple(getattr(models[m], s) for s in slots))
            for m, seq in h._changed.items()]  # type: ignore[attr-defined]


def test_the_history_is_fed_as_the_dense_windows_would_feed_it(redis_url: str, tmp_path: Path) -> None:
    """The reader feeds its history from the buckets sparsely (no zeros): the same calls in the same order
    as walking traffic.read_minutes / read_seconds model by model, so plan() sees the same history."""
    import random

    from prewarm.domain.policy import TrafficHistory
    from scheduler.snapshot import HISTORY_WARMUP_S, LATE_EVENT_LAG_S

    r = redis.Redis.from_url(redis_url)
    rnd = random.Random(7)
    now = time.time()
    names = [f"m{i}" for i in range(40)]
    events = [(rnd.choice(names[: 5 + i % 35]), rnd.randint(1, 4), now - rnd.uniform(3, 2 * 3600))
              for i in range(4000)]
    traffic.record(r, events, now=now)
    config = PolicyConfig()
    reader = SnapshotReader(r, config)
    fed = reader.feed_traffic(now)
    # The dense way: every model's series over the same windows, zeros skipped.
    dense = TrafficHistory.for_config(config)
    minute_edge = int(now // 60 * 60) - 60
    w = traffic.read_minutes(r, minute_edge - HISTORY_WARMUP_S, minute_edge)
    for model, counts in w.counts.items():
        for t, c in zip(w.times(), counts, strict=True):
            if c:
                dense.add_bucket(model, t + 30, c)
    w = traffic.read_seconds(r, minute_edge, int(now) - LATE_EVENT_LAG_S)
    arrivals = []
    for model, counts in w.counts.items():
        for t, c in zip(w.times(), counts, strict=True):
            if c:
                dense.add_bucket(model, t, c)
                arrivals.append((model, t, c))
    assert fed == sum(c for _m, _t, c in arrivals) > 0
    assert reader.arrivals == arrivals
    assert _history_state(reader.history) == _history_state(dense)
    r.close()


def test_unchanged_specs_keep_the_models_object_and_a_change_gets_a_new_one(redis_url: str, tmp_path: Path) -> None:
    """The policy's memo carries its timeline on while snapshot.models is the same object: a tick with no
    spec changed hands back last tick's dict; a changed spec makes a new one (never one with the old id)."""
    r = redis.Redis.from_url(redis_url)
    cat = catalog(tmp_path / "c", ["hot", "quiet", "other"])
    heartbeat(r, [ready("hot", 2.0)])
    replica_ready(r, ready("hot", 2.0))
    reader = SnapshotReader(r, PolicyConfig())
    first, _ = reader.read(cat, time.time())
    second, _ = reader.read(cat, time.time())
    assert second.models is first.models
    # nothing of the specs' inputs changed: none is made again (the last read's are copied), until a pin does
    made: list[str] = []
    spec = reader._spec
    reader._spec = lambda key, *a, **k: (made.append(key), spec(key, *a, **k))[1]  # type: ignore[method-assign]
    assert reader.read(cat, time.time())[0].models is first.models and made == []
    overlays.set_pinned(r, "quiet", True)
    pinned, _ = reader.read(cat, time.time())
    assert sorted(made) == ["hot", "other", "quiet"] and pinned.models["quiet"].pinned
    overlays.set_pinned(r, "quiet", False)
    assert not reader.read(cat, time.time())[0].models["quiet"].pinned
    made.clear()
    replica_ready(r, ready("hot", 8.0))  # its median load time changes: its spec alone is made again
    third, _ = reader.read(cat, time.time())
    assert made == ["hot"]
    assert third.models is not second.models and id(third.models) != id(second.models)
    assert third.models["hot"].load_seconds == pytest.approx(5.5) and third.models["other"] is second.models["other"]
    full, _ = SnapshotReader(r, PolicyConfig()).read(cat, time.time(), full=True)
    assert third.models == full.models
    r.close()


def test_an_unchanged_replica_record_keeps_its_state_object_and_a_changed_one_gets_a_new_one(
        redis_url: str, tmp_path: Path) -> None:
    r = redis.Redis.from_url(redis_url)
    cat = catalog(tmp_path / "c", ["hot", "quiet"])
    hot, quiet = ready("hot", 2.0), ready("quiet", 2.0)
    heartbeat(r, [hot, quiet])
    reader = SnapshotReader(r, PolicyConfig())
    first = {x.model: x for x in reader.read(cat, time.time())[0].replicas}
    busy = dataclasses.replace(hot, in_flight=3)
    heartbeat(r, [busy, quiet])  # hot's record changed, quiet's did not
    second = {x.model: x for x in reader.read(cat, time.time())[0].replicas}
    assert second["quiet"] is first["quiet"]
    assert second["hot"] is not first["hot"] and second["hot"].in_flight == 3 and first["hot"].in_flight == 0
    full = {x.model: x for x in SnapshotReader(r, PolicyConfig()).read(cat, time.time(), full=True)[0].replicas}
    assert full == second
    heartbeat(r, [busy])  # quiet evicted: gone from the snapshot, and from the reader's memo
    assert [x.model for x in reader.read(cat, time.time())[0].replicas] == ["hot"]
    assert [v[2] for v in reader._states.values()] == ["hot"]
    r.close()


def test_byte_counts_written_as_floats_reach_the_policy_as_whole_bytes(redis_url: str, tmp_path: Path) -> None:
    """A replica record from another writer may carry 8388608.0 where ours writes 8388608: the policy's records
    (natively built, their field types checked) get whole bytes, and plan() runs on them."""
    from prewarm.domain.policy import PolicyState, plan

    r = redis.Redis.from_url(redis_url)
    cat = catalog(tmp_path / "c1", ["hot"])
    rep = ready("hot", 2.0)
    rep.bytes, rep.total_bytes, rep.in_flight = float(rep.bytes), float(rep.total_bytes), 0.0  # type: ignore[assignment]
    g = state.Gpu(id=GPU, node="node-a", device="cpu:0", queue=state.queue_name("node-a", "cpu:0"),
                  total_bytes=GIB, used_bytes=8 * MIB, free_bytes=GIB - 8 * MIB, last_heartbeat=time.time(),
                  started_at=time.time() - 3600)
    state.write_heartbeat(r, g, [rep], ttl=60)
    snap, _ = SnapshotReader(r, PolicyConfig()).read(cat, time.time())
    [replica] = snap.replicas
    [gpu] = snap.gpus
    assert (replica.bytes, type(replica.bytes), replica.in_flight) == (8 * MIB, int, 0)
    assert (gpu.total_bytes, type(gpu.free_bytes)) == (GIB, int)
    plan(snap, time.time(), PolicyState())
    r.close()
