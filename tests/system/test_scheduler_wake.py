"""A cold route lookup wakes the leader scheduler at once, instead of at its next tick.

The route hook PUBLISHes the model on keys.WAKE once per cold episode; the leader's listener runs one extra
tick (a standby ignores it) and records a "wake" event. The process tests run the scheduler with a tick far
longer than each test's waits, so only the wake-up can explain a plan made within them.

- in-process (real Redis, hooks through the Flask test client, a Scheduler object): one publish per
  episode, a failed publish does not fail the hook, a burst of wake-ups is one tick, a standby ignores one;
- real processes (worker, gunicorn web, `prewarm scheduler`): 20 cold lookups on a full GPU make the leader
  evict and preload at once, with one preload; a standby does not plan on a wake-up; the listener
  survives a Redis restart.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
import requests
from flask.testing import FlaskClient

from prewarm import events, keys, state
from prewarm.celery_app import PRELOAD, make_celery
from prewarm.config import Settings
from prewarm.context import Context
from prewarm.redis_server import EmbeddedRedis
from prewarm.store import cold_starts
from prewarm.store.ready import replica_ready
from scheduler.live import Scheduler
from tests.model_files import tiny_catalog
from tests.procs import wait_for, worker_factory  # noqa: F401  (fixture)
from tests.scheduler_procs import SchedulerProc
from tests.web_support import WebProc, make_catalog, make_context, replica
from web.app import create_app

# Far longer than any wait below: a plan seen within a wait was made by a wake-up, not a periodic tick.
LONG_TICK = 300.0
LONG_TTL = 600.0  # the leader keeps its lock between the (long) ticks
MIN_RESIDENCY_S = 10.0  # PolicyConfig.min_residency_s: a replica this young is never evicted


def subscribers(r: redis.Redis) -> int:
    return int(dict(r.pubsub_numsub(keys.WAKE)).get(keys.WAKE.encode(), 0))


def wakes(r: redis.Redis) -> list[events.Event]:
    return events.read(r, kind="wake")


# --- in-process ------------------------------------------------------------------------------------

@pytest.fixture
def client(redis_url: str, tmp_path: Path) -> FlaskClient:
    return create_app(make_context(redis_url, make_catalog(tmp_path / "models"))).test_client()


def test_cold_episode_publishes_one_wake_up(client: FlaskClient, r: redis.Redis) -> None:
    ps = r.pubsub(ignore_subscribe_messages=True)
    ps.subscribe(keys.WAKE)
    try:
        answers = [client.get("/hooks/route?model=alpha").get_json() for _ in range(3)]
        assert [a["state"] for a in answers] == ["cold"] * 3  # no fleet: every lookup answers cold
        assert set(answers[0]) == {"model", "version", "replicas", "state", "preload", "eta_seconds"}
        got = []
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            msg = ps.get_message(timeout=0.2)
            if msg:
                got.append(msg["data"])
        assert got == [b"alpha@v1"]  # one episode, one wake-up: retries do not publish again
    finally:
        ps.close()


def test_failed_publish_does_not_fail_the_hook(client: FlaskClient, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_a: object, **_k: object) -> int:
        raise redis.ConnectionError("publish lost")

    monkeypatch.setattr(redis.Redis, "publish", broken)
    resp = client.get("/hooks/route?model=beta")
    assert resp.status_code == 200 and resp.get_json()["state"] == "cold"


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> Context:
    env = {"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(make_catalog(tmp_path / "models")),
           "PREWARM_LEADER_TTL": "30", "PREWARM_DATA_DIR": str(tmp_path / "var")}
    return Context(Settings.from_env(env))


@pytest.fixture
def listening(ctx: Context) -> Iterator[list[Scheduler]]:
    started: list[Scheduler] = []
    yield started
    for s in started:
        s.stop_listener()
        s.leadership.release()


def test_burst_of_wake_ups_is_one_tick_and_standby_ignores_them(ctx: Context, r: redis.Redis,
                                                                listening: list[Scheduler]) -> None:
    leader, standby = Scheduler(ctx, ident="s1"), Scheduler(ctx, ident="s2")
    assert leader.tick().leader and not standby.tick().leader
    for s in (leader, standby):
        s.start_listener()
        listening.append(s)
    wait_for(lambda: subscribers(r) == 2, 10, what="both listeners subscribed")
    pipe = r.pipeline(transaction=False)
    for i in range(20):
        pipe.publish(keys.WAKE, f"m{i}@v1")
    pipe.execute()  # 20 wake-ups delivered together
    wait_for(lambda: wakes(r), 10, what="the woken tick's event")
    time.sleep(0.5)  # room for a second tick, which must not come
    evs = wakes(r)
    assert len(evs) == 1, evs
    assert evs[0].actor == "scheduler" and evs[0].numbers["scheduler"] == "s1"
    assert evs[0].numbers["models"] == sorted(f"m{i}@v1" for i in range(20))
    assert "woken by a cold route lookup" in evs[0].reason
    assert r.hget(keys.SCHEDULER_STATUS, "trigger") == b"wake"
    # the loads-ahead record says where loads ahead stand (ahead.py): with no record yet they go on
    assert (r.hget(keys.SCHEDULER_STATUS, "loads_ahead") or b"").startswith(b"loads ahead on:")
    # ... and the first-request record where fills stand (firsts.py): with no record yet they take all free memory
    assert (r.hget(keys.SCHEDULER_STATUS, "fills") or b"").startswith(b"fills take all free memory:")
    # ... and no demand load held back for a busy link (written each tick: no GPU loads anything here)
    assert r.hget(keys.SCHEDULER_STATUS, "link_waits") == b""
    # ... and the record of silences keeps a silent model's measured rate while it has no verdict (silences.py)
    assert (r.hget(keys.SCHEDULER_STATUS, "stale_rates") or b"").startswith(b"silent models keep their measured rate")
    assert standby.wake(["m0@v1"]) is None  # a standby plans nothing on a wake-up
    assert len(wakes(r)) == 1


def test_a_replica_turning_ready_wakes_only_a_leader_whose_policy_waits_on_it(redis_url: str, r: redis.Redis,
                                                                              tmp_path: Path) -> None:
    """store.ready publishes "ready:<model>@<version>" on keys.WAKE. A leader running a baseline (its rule places
    waiting misses as loads finish, `wakes_on_ready`) ticks at once on it while requests wait, and records why;
    with no request waiting, or with prewarm's plan (it ticks), that wake-up waits for the next tick."""
    ps = r.pubsub(ignore_subscribe_messages=True)
    ps.subscribe(keys.WAKE)
    try:
        wait_for(lambda: subscribers(r) == 1, 10, what="subscribed")
        replica_ready(r, replica("beta", "node-a/cpu:0", "ready", version="v1", since=time.time()))
        got = []
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:  # the subscription's own reply reads as None
            msg = ps.get_message(timeout=0.2)
            if msg:
                got.append(msg["data"])
        assert got == [b"ready:beta@v1"]
    finally:
        ps.close()
    catalog = make_catalog(tmp_path / "models")

    def scheduler(policy: str) -> Scheduler:
        env = {"PREWARM_REDIS_URL": redis_url, "PREWARM_CATALOG": str(catalog), "PREWARM_LEADER_TTL": "30",
               "PREWARM_DATA_DIR": str(tmp_path / "var"), "PREWARM_POLICY": policy}
        return Scheduler(Context(Settings.from_env(env)), ident=policy)

    base = scheduler("on-demand-lru")
    assert base.tick().leader
    assert base.wake(["ready:beta@v1"]) is None  # no request waits: nothing to place now
    cold_starts.open_episode(r, "alpha", "v1", time.time())  # a router waits for alpha
    assert base.tick().leader
    res = base.wake(["ready:beta@v1"])
    assert res is not None and res.leader
    [ev] = wakes(r)
    assert ev.numbers["trigger"] == "ready" and ev.numbers["ready"] == ["beta@v1"]
    assert "beta@v1 turning ready while requests wait" in ev.reason
    base.leadership.release()
    own = scheduler("prewarm")
    assert own.tick().leader
    assert own.wake(["ready:beta@v1"]) is None  # prewarm's plan sees the waiting model at its next tick
    assert len(wakes(r)) == 1
    own.leadership.release()


# --- real processes --------------------------------------------------------------------------------

@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "models", ["tiny-lm", "tiny-lm-wide", "tiny-sharded"])


def route(web: WebProc, model: str) -> dict:
    resp = requests.get(f"{web.url}/hooks/route", params={"model": model}, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.mark.slow
def test_cold_lookups_on_a_full_fleet_wake_the_leader_to_make_room(redis_url, r, catalog, web, schedulers,
                                                                   tmp_path, worker_factory) -> None:  # noqa: F811
    # One GPU with room for one of the two models (tiny-lm-wide 2.7 MB, tiny-sharded 3.5 MB) and the peak
    # of its warmup (0.9 MB each, counted against the device while it warms).
    w = worker_factory(catalog, devices="cpu:0=4.5MiB")
    gpu = w.gpu_ids[0]
    # no fill of the models not yet asked for (firsts.py): the fleet is only what this test puts there
    sched = SchedulerProc(redis_url, catalog, tmp_path, tick=LONG_TICK, leader_ttl=LONG_TTL,
                          env={"PREWARM_FILL_SHARE": "0"})
    schedulers.append(sched)
    wait_for(sched.is_leader, 30, what="scheduler leads", log=sched.log)
    wait_for(lambda: subscribers(r) == 1, 30, what="scheduler listens for wake-ups", log=sched.log)
    # tiny-lm-wide fills the GPU (sent straight to the worker: no scheduler decision involved) and grows
    # older than the minimum residency, so the policy may evict it.
    make_celery(redis_url).send_task(PRELOAD, args=["tiny-lm-wide", "v1"], queue=w.queues[gpu])
    wide = wait_for(lambda: next((x for x in state.read_fleet(r).replicas("tiny-lm-wide") if x.state == "ready"),
                                 None), 60, what="tiny-lm-wide ready", log=w.log)
    wait_for(lambda: time.time() - wide.since > MIN_RESIDENCY_S + 0.5, 30, what="minimum residency")
    g = state.read_fleet(r).gpu(gpu)
    assert g is not None and g.free_bytes < 3_461_632  # no room for tiny-sharded
    assert not wakes(r)

    with ThreadPoolExecutor(8) as pool:  # a burst of 20 routers asking at once
        answers = list(pool.map(lambda _: route(web, "tiny-sharded"), range(20)))
    assert {a["state"] for a in answers} <= {"cold", "loading"}
    cold = [a for a in answers if a["state"] == "cold"]
    assert cold and set(cold[0]) == {"model", "version", "replicas", "state", "preload", "eta_seconds"}
    assert not any(a["preload"]["queued"] for a in cold), cold  # no room: the router sent nothing itself

    # Behaviour check, not a timing: the next periodic tick is LONG_TICK away, far beyond this wait, so
    # only the wake-up can have planned the eviction and the preload.
    wait_for(lambda: any(x.state == "ready" for x in state.read_fleet(r).replicas("tiny-sharded")), 60,
             what="tiny-sharded ready after the wake-up", log=lambda: sched.log() + "\n--- worker ---\n" + w.log())
    assert not state.read_fleet(r).replicas("tiny-lm-wide")
    evicts = [e for e in events.read(r, model="tiny-lm-wide") if e.kind == "evict"]
    preloads = [e for e in events.read(r, model="tiny-sharded") if e.kind == "preload"]
    assert len(evicts) == 1 and evicts[0].actor == "scheduler" and "make room" in evicts[0].reason, evicts
    assert len(preloads) == 1 and preloads[0].actor == "scheduler", preloads  # 20 lookups, one preload
    woke = wakes(r)
    assert len(woke) == 1, woke  # one cold episode, one wake-up, one extra tick
    assert woke[0].model == "tiny-sharded" and woke[0].numbers["models"] == ["tiny-sharded@v1"]
    assert woke[0].numbers["scheduler"] == sched.ident and woke[0].numbers["dispatched"] >= 2
    assert "woken by a cold route lookup" in woke[0].reason
    assert woke[0].ts <= preloads[0].ts + 1.0  # the woken tick is the one that sent the preload
    assert "tick woken by tiny-sharded@v1" in sched.log()


@pytest.mark.slow
def test_standby_does_not_plan_on_a_wake_up(redis_url, r, catalog, web, schedulers, tmp_path) -> None:
    leader = SchedulerProc(redis_url, catalog, tmp_path / "a", tick=LONG_TICK, leader_ttl=LONG_TTL)
    schedulers.append(leader)
    wait_for(leader.is_leader, 30, what="first scheduler leads", log=leader.log)
    standby = SchedulerProc(redis_url, catalog, tmp_path / "b", tick=LONG_TICK, leader_ttl=LONG_TTL)
    schedulers.append(standby)
    wait_for(lambda: subscribers(r) == 2, 30, what="both schedulers listen", log=standby.log)
    assert route(web, "tiny-lm")["state"] == "cold"
    wait_for(lambda: "wake-up for tiny-lm@v1 ignored" in standby.log(), 30, what="standby ignores the wake-up",
             log=standby.log)
    woke = wait_for(lambda: wakes(r), 30, what="leader's woken tick", log=leader.log)
    assert [e.numbers["scheduler"] for e in woke] == [leader.ident]
    assert "tick woken by" not in standby.log()
    assert leader.is_leader() and not standby.is_leader()


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.stop()


@pytest.mark.slow
def test_wake_listener_survives_a_redis_restart(own_redis: EmbeddedRedis, catalog: Path, tmp_path: Path) -> None:
    url = own_redis.url
    sched = SchedulerProc(url, catalog, tmp_path, tick=LONG_TICK, leader_ttl=LONG_TTL)
    try:
        r = redis.Redis.from_url(url)
        wait_for(sched.is_leader, 30, what="scheduler leads", log=sched.log)
        wait_for(lambda: subscribers(r) == 1, 30, what="scheduler listens", log=sched.log)
        own_redis.stop()  # loses everything, the leader lock included
        time.sleep(1.5)
        restarted = EmbeddedRedis(port=own_redis.port).start()
        own_redis.proc, own_redis.dir = restarted.proc, restarted.dir  # the fixture stops it
        r = redis.Redis.from_url(url)
        wait_for(lambda: subscribers(r) == 1, 30, what="listener resubscribed", log=sched.log)
        assert sched.proc.poll() is None
        r.publish(keys.WAKE, "tiny-lm@v1")
        # No periodic tick is due for LONG_TICK: the woken tick takes the lead again and records the wake-up.
        woke = wait_for(lambda: wakes(r), 30, what="woken tick after the restart", log=sched.log)
        assert woke[0].numbers["scheduler"] == sched.ident
        assert sched.is_leader()
    finally:
        sched.stop()
