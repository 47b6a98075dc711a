"""The store's records against a real Redis: cold-start episodes opened and closed exactly once, what a
replica turning ready records, the one limit on load times, and the Redis-backed histograms."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from prewarm import keys, metrics_defs, state
from prewarm.store import cold_starts, histograms, load_times
from prewarm.store.ready import replica_ready
from tests.web_support import publish_gpu, replica

GPU = "node-a/cpu:0"
COLD = metrics_defs.COLD_START_DURATION.name
LOAD = metrics_defs.MODEL_LOAD.name
WARMUP = metrics_defs.MODEL_WARMUP.name


def counts(r: redis.Redis) -> dict[str, histograms.Counts]:
    return histograms.read(r, metrics_defs.REDIS_HISTOGRAMS)


def ready_replica(model: str = "alpha", version: str = "v1", *, since: float, load: float = 2.0,
                  warmup: float = 0.5, gpu: str = GPU, source: str = "storage") -> state.Replica:
    rep = replica(model, gpu, "ready", version=version, since=since)
    rep.load_seconds, rep.warmup_seconds, rep.source = load, warmup, source
    return rep


def test_an_episode_opens_once_until_it_is_abandoned(r: redis.Redis) -> None:
    now = time.time()
    assert cold_starts.open_episode(r, "alpha", "v1", now)
    assert not cold_starts.open_episode(r, "alpha", "v1", now + 5)  # the same episode, however many lookups
    assert cold_starts.read_open(r, now + 5)["alpha"] == cold_starts.ColdStart("alpha", "v1", now)
    # Open past ABANDON_AFTER_S (its loads kept failing): over, uncounted; the next lookup opens a new one.
    later = now + cold_starts.ABANDON_AFTER_S + 1
    assert "alpha" not in cold_starts.read_open(r, later)
    assert cold_starts.open_episode(r, "alpha", "v1", later)
    assert cold_starts.read_open(r, later)["alpha"].seen_at == later
    # An unreadable record does not block episodes either.
    r.hset(keys.COLD_STARTS, "beta", "{not json")
    assert cold_starts.read_open(r, later).keys() == {"alpha"}
    assert cold_starts.open_episode(r, "beta", "v1", later)


def test_replica_ready_records_its_load_and_closes_its_cold_start_once(r: redis.Redis) -> None:
    seen = time.time() - 10
    cold_starts.open_episode(r, "alpha", "v1", seen)
    assert replica_ready(r, ready_replica(since=seen + 4.0, load=2.0, warmup=0.5)) == pytest.approx(4.0)
    c = counts(r)
    assert (c[COLD].count, c[LOAD].count, c[WARMUP].count) == (1, 1, 1)
    assert c[COLD].sum == pytest.approx(4.0) and c[LOAD].sum == pytest.approx(2.0)
    assert cold_starts.read_open(r) == {} and cold_starts.last_durations(r) == {"alpha": 4.0}
    assert load_times.recent(r, ["alpha"])["alpha"] == load_times.Measured(load=[2.5], promote=[])
    assert r.lrange(keys.DEMAND_DELAYS, 0, -1) == [b"1.5000"]  # 4 s cold, 2.5 s of it its own load and warmup
    # A second replica of it (another GPU) is a new load, not a second end of that cold start.
    assert replica_ready(r, ready_replica(since=seen + 6.0, gpu="node-a/cpu:1", source="host")) is None
    c = counts(r)
    assert (c[COLD].count, c[LOAD].count, c[WARMUP].count) == (1, 2, 2)
    assert load_times.recent(r, ["alpha"])["alpha"] == load_times.Measured(load=[2.5], promote=[2.5])
    assert r.llen(keys.DEMAND_DELAYS) == 1


def test_a_load_under_way_before_the_first_cold_lookup_teaches_no_delay(r: redis.Redis) -> None:
    """A cold start shorter than its replica's own load and warmup (the load began before the request: a load ahead,
    or one in flight) shows no delay before a demand load: none is recorded. The list keeps the newest KEPT_DELAYS."""
    seen = time.time() - 10
    cold_starts.open_episode(r, "alpha", "v1", seen)
    assert replica_ready(r, ready_replica(since=seen + 1.0, load=2.0, warmup=0.5)) == pytest.approx(1.0)
    assert r.llen(keys.DEMAND_DELAYS) == 0
    for i in range(load_times.KEPT_DELAYS + 5):
        cold_starts.open_episode(r, f"m{i}", "v1", seen)
        replica_ready(r, ready_replica(f"m{i}", since=seen + 3.0 + i, load=2.0, warmup=0.5))
    delays = load_times.median_delay(r.lrange(keys.DEMAND_DELAYS, 0, -1))
    assert r.llen(keys.DEMAND_DELAYS) == load_times.KEPT_DELAYS and delays == pytest.approx(0.5 + 29.5)


def test_a_replica_of_another_version_leaves_the_cold_start_open(r: redis.Redis) -> None:
    seen = time.time()
    cold_starts.open_episode(r, "alpha", "v2", seen)
    assert replica_ready(r, ready_replica(version="v1", since=seen + 1)) is None
    assert cold_starts.read_open(r)["alpha"].version == "v2" and counts(r)[COLD].count == 0


def test_a_replica_ready_before_the_episode_opened_does_not_end_it(r: redis.Redis) -> None:
    """The episode a lookup opened after this replica was ready (it read the fleet a moment before) is not
    this load's: the load is recorded, the episode left for the lookup that sees the replica ready."""
    seen = time.time()
    cold_starts.open_episode(r, "alpha", "v1", seen)
    assert replica_ready(r, ready_replica(since=seen - 0.5)) is None
    assert "alpha" in cold_starts.read_open(r) and counts(r)[LOAD].count == 1
    publish_gpu(r, GPU, replicas=[ready_replica(since=seen - 0.5)])
    assert cold_starts.close_ready(r, state.read_fleet(r), ["alpha"]) == {"alpha": 0.0}


def test_the_worker_and_route_lookups_closing_at_once_count_the_cold_start_once(r: redis.Redis) -> None:
    seen = time.time() - 3
    cold_starts.open_episode(r, "alpha", "v1", seen)
    rep = ready_replica(since=seen + 3)
    publish_gpu(r, GPU, replicas=[rep])
    fleet = state.read_fleet(r)
    start = threading.Barrier(9)
    closed: list[float | None] = []

    def lookup() -> None:
        client = redis.Redis(connection_pool=r.connection_pool)
        start.wait()
        closed.extend(cold_starts.close_ready(client, fleet, ["alpha"]).values())

    def worker() -> None:
        start.wait()
        closed.append(replica_ready(r, rep))

    threads = [threading.Thread(target=lookup) for _ in range(8)] + [threading.Thread(target=worker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [x for x in closed if x is not None] == [pytest.approx(3.0)]
    c = counts(r)
    assert c[COLD].count == 1 and c[COLD].sum == pytest.approx(3.0) and c[LOAD].count == 1


def test_route_lookups_drop_episodes_abandoned_with_nothing_ready(r: redis.Redis) -> None:
    now = time.time()
    cold_starts.open_episode(r, "alpha", "v1", now - cold_starts.ABANDON_AFTER_S - 1)
    cold_starts.open_episode(r, "beta", "v1", now - 1)
    publish_gpu(r, GPU)
    assert cold_starts.close_ready(r, state.read_fleet(r), now=now) == {}
    assert r.hkeys(keys.COLD_STARTS) == [b"beta"] and counts(r)[COLD].count == 0


def test_load_times_keep_one_limit_for_every_reader(r: redis.Redis) -> None:
    pipe = r.pipeline()
    for i in range(load_times.KEPT + 5):  # oldest first, as the worker records them
        load_times.push(pipe, ready_replica(since=0.0, load=float(i), warmup=0.0))
    pipe.execute()
    assert r.llen(keys.load_times("alpha")) == load_times.KEPT  # trimmed where written
    got = load_times.recent(r, ["alpha", "beta"])
    assert got["alpha"].load == [float(i) for i in range(load_times.KEPT + 4, 4, -1)]  # newest first
    assert got["beta"] == load_times.Measured()
    r.lpush(keys.load_times("beta"), "garbage")
    assert load_times.recent(r, ["beta"])["beta"].load == []  # corrupt: unmeasured, not a failed reader


def test_histogram_buckets_follow_prometheus_le(r: redis.Redis) -> None:
    d = metrics_defs.MODEL_LOAD
    pipe = r.pipeline()
    for v in (0.1, 0.11, 300.0, 301.0):  # on a bound counts in that bucket; above every bound, in +Inf only
        histograms.observe(pipe, d, v)
    pipe.execute()
    h = counts(r)[d.name]
    cumulative = dict(h.buckets)
    assert cumulative[0.1] == 1 and cumulative[0.25] == 2 and cumulative[120.0] == 2
    assert cumulative[300.0] == 3 and h.buckets[-1] == (float("inf"), 4) and h.count == 4
    assert h.sum == pytest.approx(601.21)
