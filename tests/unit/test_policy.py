"""Unit tests of prewarm.domain.policy.plan on hand-built snapshots with an injected clock."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import replace

import pytest

from prewarm.domain.choice import PrewarmPolicy
from prewarm.domain.policy import (
    GIB,
    Evict,
    GpuState,
    Intent,
    ModelSpec,
    PolicyConfig,
    PolicyState,
    Preload,
    ReplicaState,
    Snapshot,
    TrafficHistory,
    plan,
)
from prewarm.domain.policy.placement import cheapest_cover

CFG = PolicyConfig()
# loads share a busy link as they did before the link wait (PolicyConfig.link_wait): for tests of the slots, caps and
# yields, which a wait would otherwise pre-empt (the wait has its own test below)
SHARED = PolicyConfig(link_wait=False)


class World:
    """A minimal fleet driven by plan(): loads finish after the model's load time, evictions are
    instant. Records every action and checks the budget after every tick."""

    def __init__(self, models: list[ModelSpec], gpus: list[GpuState], cfg: PolicyConfig = CFG,
                 keep_state: bool = True) -> None:
        self.models = {m.id: m for m in models}
        self.gpus = {g.id: g for g in gpus}
        self.cfg = cfg
        self.traffic = TrafficHistory.for_config(cfg)
        self.replicas: dict[tuple[str, str], ReplicaState] = {}
        self.evicted_at: dict[str, float] = {}
        self.state = PolicyState() if keep_state else None
        self.log: list[tuple[float, object]] = []
        self.in_flight: dict[str, int] = {}

    def add_replica(self, model: str, gpu: str, since: float = -1e6, state: str = "ready") -> None:
        self.replicas[(model, gpu)] = ReplicaState(model, gpu, state, self.models[model].size_bytes, since)

    def snapshot(self) -> Snapshot:
        gpus = []
        for g in self.gpus.values():
            used = sum(r.bytes for r in self.replicas.values() if r.gpu == g.id)
            gpus.append(GpuState(g.id, g.node, g.total_bytes, g.total_bytes - used, g.joined_at, g.alive))
        reps = tuple(
            ReplicaState(r.model, r.gpu, r.state, r.bytes, r.since, last_request=r.last_request,
                         in_flight=self.in_flight.get(r.model, 0))
            for r in self.replicas.values()
        )
        return Snapshot(self.models, tuple(gpus), reps, self.traffic,
                        recent_evictions=dict(self.evicted_at), config=self.cfg)

    def ready(self, model: str) -> list[str]:
        return sorted(g for (m, g), r in self.replicas.items() if m == model and r.state == "ready")

    def held(self, model: str) -> list[str]:
        return sorted(g for (m, g) in self.replicas if m == model)

    def tick(self, now: float) -> list:
        # finish loads
        for key, r in list(self.replicas.items()):
            spec = self.models.get(r.model)
            if spec is not None and r.state == "loading" and now >= r.since + (spec.load_seconds or 0.0):
                self.replicas[key] = ReplicaState(r.model, r.gpu, "ready", r.bytes, r.since)
        actions = plan(self.snapshot(), now, self.state)
        for a in actions:
            self.log.append((now, a))
            if isinstance(a, Evict):
                r = self.replicas.pop((a.model, a.gpu))
                assert r.state == "ready" or a.kind == "yield"  # a yield cancels a load in flight
                self.evicted_at[a.model] = now
            else:
                assert isinstance(a, Preload)
                assert (a.model, a.gpu) not in self.replicas
                self.replicas[(a.model, a.gpu)] = ReplicaState(
                    a.model, a.gpu, "loading", self.models[a.model].size_bytes, now)
        for g in self.gpus.values():  # the budget is never exceeded
            used = sum(r.bytes for r in self.replicas.values() if r.gpu == g.id)
            assert used <= g.total_bytes, f"{g.id} over budget at {now}"
        return actions

    def run(self, start: float, end: float, arrivals: dict[int, list[tuple[str, int]]] | None = None) -> None:
        """Plan every tick_s; `arrivals` maps a second to (model, count) pairs fed before the tick."""
        t = start
        sec = int(start)
        while t <= end:
            while sec <= t:
                for model, count in (arrivals or {}).get(sec, []):
                    self.traffic.add_bucket(model, sec, count)
                sec += 1
            self.tick(t)
            t += self.cfg.tick_s

    def preloads(self, model: str | None = None, kind: str | None = None) -> list[tuple[float, Preload]]:
        return [(t, a) for t, a in self.log if isinstance(a, Preload)
                and (model is None or a.model == model) and (kind is None or a.kind == kind)]

    def evictions(self, model: str | None = None) -> list[tuple[float, Evict]]:
        return [(t, a) for t, a in self.log if isinstance(a, Evict) and (model is None or a.model == model)]


def gpu(gid: str, gib: float, joined_at: float = -1e9) -> GpuState:
    node = gid.split("/")[0]
    return GpuState(gid, node, int(gib * GIB), int(gib * GIB), joined_at=joined_at)


def spec(mid: str, gib: float, load_s: float = 4.0, **kw) -> ModelSpec:
    return ModelSpec(mid, int(gib * GIB), load_seconds=load_s, **kw)


# ---- rising demand and scaling ------------------------------------------------------------

def test_ramping_model_gets_replicas_before_its_rate_peaks() -> None:
    """A capped model ramps from 1/s to 20/s over 200 s; at 4/s per replica it needs 5 replicas
    at the peak. Each replica must be ready before the rate reaches what it is needed for."""
    w = World([spec("ramp", 2, load_s=8.0, max_rate_per_replica=4.0)],
              [gpu(f"n{i}/cuda:0", 10) for i in range(6)])
    arrivals: dict[int, list[tuple[str, int]]] = {}
    for s in range(0, 400):
        rate = 1.0 + 19.0 * min(1.0, s / 200.0)
        arrivals[s] = [("ramp", int(round(rate)))]
    w.run(0.0, 400.0, arrivals)
    loads = w.preloads("ramp")
    assert loads[0][1].kind == "demand"
    scale = [t for t, a in loads if a.kind == "scale"]
    assert len(scale) >= 4
    # replica n+1 is needed from the first second the rate exceeds 4n; it must be ready by then
    for n, t in enumerate(scale[:4], start=1):
        needed_at = min(s for s, ((_m, c),) in arrivals.items() if c > 4 * n)
        assert t + 8.0 <= needed_at, (n, t, needed_at)
    assert all(t < 200.0 for t in scale[:4])  # all before the peak
    reason = next(a for t, a in loads if a.kind == "scale").reason
    assert "forecast" in reason and "/s" in reason and "per replica" in reason


def test_first_requests_of_a_cold_model_load_it_on_demand_with_numbers() -> None:
    w = World([spec("a", 1)], [gpu("n1/cuda:0", 4)])
    w.traffic.add("a", 10.2, 3)
    acts = w.tick(10.5)
    assert [(type(a).__name__, a.model, a.kind) for a in acts] == [("Preload", "a", "demand")]
    assert "rate" in acts[0].reason and "load 4.0 s" in acts[0].reason
    assert acts[0].numbers["load_s"] == 4.0
    assert w.tick(12.5) == []  # loading: no second load


def test_demand_loads_wait_for_a_free_load_slot_and_the_most_valuable_goes_first() -> None:
    """One GPU running max_loads_per_gpu (2) loads: more demand loads are not sent (they would slow
    the two in flight); when both finish, the two waiting models with the most requests per reload
    take the slots and the third waits for the next free one."""
    w = World([spec(m, 1, load_s=20.0) for m in ("a", "b", "busy", "mid", "quiet")], [gpu("n1/cuda:0", 8)],
              cfg=SHARED)
    w.traffic.add("a", 0.2)
    w.traffic.add("b", 0.4)
    first = w.tick(1.0)
    assert sorted((a.model, a.kind) for a in first) == [("a", "demand"), ("b", "demand")]
    placed: dict[float, list[tuple[str, str]]] = {}
    for k in range(40):  # while they load, three more models are asked for, every second
        w.traffic.add("busy", 2.0 + k, 30)
        w.traffic.add("mid", 2.3 + k, 5)
        w.traffic.add("quiet", 2.6 + k)
        acts = w.tick(3.0 + k)
        if acts:
            placed[3.0 + k] = [(a.model, a.kind) for a in acts]
    # a and b are ready at 21 s: busy and mid take the two slots, busiest first; quiet waits for
    # the next free slot (busy's and mid's loads end at 41 s)
    assert placed == {21.0: [("busy", "demand"), ("mid", "demand")], 41.0: [("quiet", "demand")]}


def test_of_two_models_asked_for_alike_the_faster_to_load_takes_the_free_slot() -> None:
    """Smith's rule: with one slot free, the model with more requests per second of load time goes
    first (5 s of load before 40 s: fewer requests arrive while both wait and load)."""
    w = World([spec("a", 1, load_s=20.0), spec("slow", 1, load_s=40.0), spec("fast", 1, load_s=5.0)],
              [gpu("n1/cuda:0", 8)], cfg=PolicyConfig(max_loads_per_gpu=1))
    w.traffic.add("a", 0.2)
    assert [a.model for a in w.tick(1.0)] == ["a"]
    placed: dict[float, list[str]] = {}
    for k in range(60):
        for m in ("slow", "fast"):
            w.traffic.add(m, 2.0 + k, 3)
        acts = w.tick(3.0 + k)
        if acts:
            placed[3.0 + k] = [a.model for a in acts]
    assert placed == {21.0: ["fast"], 26.0: ["slow"]}


def test_without_the_cap_every_demand_load_starts_at_once() -> None:
    w = World([spec("a", 1, load_s=20.0), spec("b", 1, load_s=20.0), spec("c", 1, load_s=20.0)],
              [gpu("n1/cuda:0", 8)], cfg=PolicyConfig(max_loads_per_gpu=0, link_wait=False))
    for i, m in enumerate("abc"):
        w.traffic.add(m, 0.2 + i / 10)
    assert sorted(a.model for a in w.tick(1.0)) == ["a", "b", "c"]


# ---- learned periodic arrivals ------------------------------------------------------------

def hourly_world(cfg: PolicyConfig = CFG) -> tuple[World, dict[int, list[tuple[str, int]]]]:
    w = World([spec("hourly", 2, load_s=6.0), spec("other", 1)], [gpu("n1/cuda:0", 8)], cfg=cfg)
    # history: called at 5 s past each hour for 8 hours
    for h in range(8):
        w.traffic.add("hourly", h * 3600 + 5.0)
    return w, {}


def test_hourly_model_stays_resident_through_its_quiet_hour_while_no_load_needs_the_memory() -> None:
    """Issue 12: releasing memory nobody needs cannot save a cold start. With no idle-memory
    budget (the default) the quiet hourly model stays on its GPU (6 of 8 GiB free all hour) and
    the next hour's request finds it ready: no eviction, no reload (the one preload is the free
    memory's fill with `other`, never requested)."""
    w, _ = hourly_world()
    t0 = 7 * 3600 + 5.0
    w.add_replica("hourly", "n1/cuda:0", since=t0 - 6.0)
    w.run(t0 + 1, t0 + 3600 + 30, {int(t0 + 3600): [("hourly", 1)]})
    assert w.evictions() == []
    assert [(a.model, a.kind) for _t, a in w.preloads()] == [("other", "fill")]
    assert w.ready("hourly") == ["n1/cuda:0"]


def test_hourly_model_is_warmed_shortly_before_the_hour_and_released_after() -> None:
    """With an idle-memory budget of 0 a quiet replica may hold nothing: the hourly model is
    released in its quiet stretch and warmed again shortly before the hour."""
    w, _ = hourly_world(PolicyConfig(idle_memory_budget=0.0))
    t0 = 7 * 3600 + 5.0  # its last call; it is resident from that call
    w.add_replica("hourly", "n1/cuda:0", since=t0 - 6.0)
    w.run(t0 + 1, t0 + 3600 - 60, None)
    ev = w.evictions("hourly")
    assert len(ev) == 1 and ev[0][1].kind == "idle_budget"
    assert ev[0][0] < t0 + 15 * 60  # released well before the next hour
    assert "idle-memory budget" in ev[0][1].reason and "quiet" in ev[0][1].reason
    w.run(t0 + 3600 - 60 + CFG.tick_s, t0 + 3600 + 30, {int(t0 + 3600): [("hourly", 1)]})
    pre = w.preloads("hourly", "speculative")
    assert len(pre) == 1
    t_load = pre[0][0]
    # shortly before the hour: ready before the request, but not more than 3 minutes early
    assert t0 + 3600 - 180 <= t_load <= t0 + 3600 - 6.0
    assert "P(request within" in pre[0][1].reason
    assert w.ready("hourly") == ["n1/cuda:0"]


def test_model_seen_once_is_not_speculatively_reloaded() -> None:
    w = World([spec("once", 1)], [gpu("n1/cuda:0", 8)])
    w.traffic.add("once", 100.0)
    w.run(100.0, 3 * 3600.0)
    assert [a.kind for _t, a in w.preloads("once")] == ["demand"]


# ---- placement and eviction ---------------------------------------------------------------

def test_evicts_lowest_value_per_byte_to_make_room() -> None:
    """busy (called every few seconds) and rare (once, 3 h ago) share a full GPU; a new model
    must evict rare, not busy."""
    cfg = PolicyConfig(p_release=0.0)  # no quiet releases: room must be made by value
    w = World([spec("busy", 3), spec("rare", 3), spec("new", 3)], [gpu("n1/cuda:0", 6)], cfg=cfg)
    for s in range(0, 10800, 5):
        w.traffic.add("busy", float(s))
    w.traffic.add("rare", 10.0)
    w.add_replica("busy", "n1/cuda:0")
    w.add_replica("rare", "n1/cuda:0")
    w.traffic.add("new", 10800.0)
    acts = w.tick(10800.5)
    kinds = [(type(a).__name__, a.model) for a in acts]
    assert ("Evict", "rare") in kinds and ("Preload", "new") in kinds
    assert ("Evict", "busy") not in kinds
    ev = next(a for a in acts if isinstance(a, Evict))
    assert ev.kind == "make_room" and "lowest value per byte" in ev.reason
    assert kinds.index(("Evict", "rare")) < kinds.index(("Preload", "new"))


def evicted_for_new(w: World, streams: dict[str, Iterable[int]], placed: dict[str, str], at: float) -> list[str]:
    """Each model's requests at the seconds `streams` gives, a ready replica of each `placed` model on its GPU, then a
    request for `new` at `at` and a tick: the models its demand load evicted."""
    for m, seconds in streams.items():
        for s in seconds:
            w.traffic.add(m, float(s))
    for m, g in placed.items():
        w.add_replica(m, g)
    w.traffic.add("new", at)
    w.tick(at + 0.5)
    return [a.model for _t, a in w.evictions()]


def evicted_beside_a_stopped_stream(reading: str, others: dict[str, Iterable[int]] | None = None) -> list[str]:
    """stopped was asked for every 2 s for 20 minutes and not since (8 minutes); live every 30 s up to 30 s ago. A
    demand load of new on their full GPU evicts one of them (PolicyConfig.refute_stale_rate's `reading`). `others`:
    more streams in the fleet's traffic (not resident), whose silences the "auto" reading learns from."""
    cfg = PolicyConfig(p_release=0.0, refute_stale_rate=reading)  # no quiet releases: room must be made by value
    w = World([spec("stopped", 3), spec("live", 3), spec("new", 3)], [gpu("n1/cuda:0", 6)], cfg=cfg)
    return evicted_for_new(w, {"stopped": range(0, 1200, 2), "live": range(0, 1670, 30), **(others or {})},
                           {"stopped": "n1/cuda:0", "live": "n1/cuda:0"}, 1680.0)


def test_a_stopped_streams_rate_values_it_until_refuted_where_that_is_on() -> None:
    """Off, stopped keeps the 10-minute rate it had while it ran (0.5/s, decayed to ~0.2/s) and live (1/30 s) goes;
    on, its silence (240 of its requests missing) refutes that rate, its idle-time model values it, and it goes
    (docs/simulation.md, "A stopped stream's rate")."""
    assert evicted_beside_a_stopped_stream("off") == ["live"]
    assert evicted_beside_a_stopped_stream("on") == ["stopped"]


def test_auto_refutes_a_silent_models_rate_where_the_fleets_streams_stop() -> None:
    """"auto" (the default) refutes the rate where the fleet's refuted silences have mostly been stops (silences.py):
    beside four streams that ran for 15 minutes and stopped, stopped goes; beside four that paused for 30 s each
    minute and went on, live goes, as with the refutation off; with no record but stopped's own stop, live goes."""
    stopping = {f"other{i}": range(0, 900, 2) for i in range(4)}
    pausing = {f"other{i}": [s for s in range(0, 1680, 2) if s % 60 < 28] for i in range(4)}
    assert evicted_beside_a_stopped_stream("auto", stopping) == ["stopped"]
    assert evicted_beside_a_stopped_stream("auto", pausing) == ["live"]
    assert evicted_beside_a_stopped_stream("auto") == ["live"]


def evict_for_new(new_load_s: float) -> list[str]:
    """Two full GPUs, one replica each: slow (30 s to load, asked for 3 times at the start of every minute) and fast
    (2 s, every 10 s); a demand load of new (new_load_s) must evict one of them. The models evicted."""
    cfg = PolicyConfig(p_release=0.0)  # no quiet releases: room must be made by value
    w = World([spec("slow", 6, load_s=30.0), spec("fast", 6, load_s=2.0), spec("new", 6, load_s=new_load_s)],
              [gpu("n1/cuda:0", 8), gpu("n2/cuda:0", 8)], cfg=cfg)
    slow = [s + b for s in range(0, 10800, 60) for b in range(3)]
    return evicted_for_new(w, {"slow": slow, "fast": range(3, 10800, 10)},
                           {"slow": "n1/cuda:0", "fast": "n2/cuda:0"}, 10800.0)


def test_the_eviction_horizon_is_the_catalogs_median_load_where_longer() -> None:
    """Over 10 s (the catalog's median load 4 s) slow's expected requests are fewer than fast's, and it goes; where
    the catalog's loads take 30 s (median 30 s: placement.horizon) each victim is counted over 30 s, slow's reach
    the cost of its reload (its burst arrives while it loads), and fast goes, whose way back is one request."""
    assert evict_for_new(4.0) == ["slow"]
    assert evict_for_new(30.0) == ["fast"]


def test_the_catalogs_median_load_is_kept_with_the_catalog_and_follows_a_new_one() -> None:
    w = World([spec("a", 1, load_s=2.0), spec("b", 1, load_s=4.0), spec("c", 1, load_s=40.0)], [gpu("n1/cuda:0", 8)])
    w.tick(0.0)
    assert w.state is not None and w.state.catalog_load_s == 4.0
    w.models = {**w.models, "b": spec("b", 1, load_s=30.0)}  # a new mapping: b's load measured again
    w.tick(2.0)
    assert w.state.catalog_load_s == 30.0
    w.models = {m: sp for m, sp in w.models.items() if m != "c"}  # c leaves the catalog
    w.tick(4.0)
    assert w.state.catalog_load_s == 16.0


def test_a_victim_that_the_last_one_made_needless_is_kept() -> None:
    """A full 10 GiB GPU: a (1 GiB, asked for once, 3 h ago) and big (6 GiB, every 30 s) have the lowest values per
    byte, three 1 GiB models asked for every 20 s the highest. A 2 GiB demand load: the order takes a, then big,
    whose 6 GiB alone make the room. a stays (cheapest_cover); without it both went."""
    cfg = PolicyConfig(p_release=0.0, no_regret=False)  # no quiet releases; prewarm's own order
    hot = ["h0", "h1", "h2"]
    w = World([spec("a", 1), spec("big", 6), *(spec(m, 1) for m in hot), spec("new", 2)], [gpu("n1/cuda:0", 10)],
              cfg=cfg)
    w.traffic.add("a", 0.0)
    for s in range(0, 10800, 30):
        w.traffic.add("big", float(s))
    for i, m in enumerate(hot):
        for s in range(i, 10800, 20):
            w.traffic.add(m, float(s))
    for m in ("a", "big", *hot):
        w.add_replica(m, "n1/cuda:0")
    w.traffic.add("new", 10800.0)
    acts = w.tick(10800.5)
    assert [a.model for a in acts if isinstance(a, Evict)] == ["big"] and ("new", "n1/cuda:0") in w.replicas


def test_of_two_models_silent_past_the_histogram_the_longer_silent_goes_first() -> None:
    """A full 3 GiB GPU: `z_old` and `a_recent` (1 GiB each) were asked for alike, every 10 min for a day, and have
    been silent since, 20 h and 6 h: both past the idle-time histogram's 4 h, where its tail alone speaks. The
    longer silence is the longer expected wait (the Lomax tail's mean residual life grows with it), so a 1 GiB
    demand load evicts z_old. With a memoryless tail they were worth the same, and the name broke the tie."""
    cfg = PolicyConfig(p_release=0.0, no_regret=False)  # no quiet releases; prewarm's own order
    w = World([spec("z_old", 1), spec("a_recent", 1), spec("hot", 1), spec("new", 1)], [gpu("n1/cuda:0", 3)],
              cfg=cfg)
    day = 86400.0
    for m, end in (("z_old", day), ("a_recent", day + 14 * 3600.0)):
        for s in range(int(end - day), int(end), 600):
            w.traffic.add(m, float(s))
    now = day + 20 * 3600.0
    for s in range(0, int(now), 20):
        w.traffic.add("hot", float(s))
    for m in ("z_old", "a_recent", "hot"):
        w.add_replica(m, "n1/cuda:0")
    w.traffic.add("new", now)
    acts = w.tick(now + 0.5)
    assert [a.model for a in acts if isinstance(a, Evict)] == ["z_old"] and ("new", "n1/cuda:0") in w.replicas


def test_the_cheapest_subset_of_the_victims_that_still_makes_room() -> None:
    a, big, b, c = (0.01, 2 * GIB), (0.05, 6 * GIB), (0.02, GIB), (0.02, GIB)
    assert cheapest_cover([a, big], 3 * GIB, 0.06) == [1]  # big alone frees the room
    assert cheapest_cover([a, big], 7 * GIB, 0.06) is None  # both are needed
    assert cheapest_cover([b, c, a, big], 2 * GIB, 0.1) == [2]  # a alone, the cheapest that frees 2 GiB
    assert cheapest_cover([b, c, big], 2 * GIB, 0.09) == [0, 1]  # 0.04 < 0.05
    assert cheapest_cover([b, c], 2 * GIB, 0.04) is None


def idle_world(cfg: PolicyConfig = CFG) -> World:
    """A 10 GiB GPU holding busy (3 GiB, a request every 5 s for 3 h: expected demand), two quiet
    models requested once 3 h ago (q_big 2 GiB, q_small 1 GiB: the same history, so the same
    value, and q_big has half q_small's value per byte) and never (1 GiB, never requested:
    value 0). 7 GiB used, 3 GiB free; idle (no expected demand): q_big + q_small + never = 4 GiB."""
    w = World([spec("busy", 3), spec("q_big", 2), spec("q_small", 1), spec("never", 1), spec("new", 5)],
              [gpu("n1/cuda:0", 10)], cfg=cfg)
    for s in range(0, 10800, 5):
        w.traffic.add("busy", float(s))
    w.traffic.add("q_big", 10.0)
    w.traffic.add("q_small", 10.0)
    for m in ("busy", "q_big", "q_small", "never"):
        w.add_replica(m, "n1/cuda:0")
    return w


def test_ready_replicas_with_no_demand_are_not_evicted_while_no_load_needs_their_memory() -> None:
    w = idle_world()
    w.run(10800.0, 10800.0 + 1800.0)  # half an hour of ticks: q_big, q_small stay quiet, never unasked
    assert w.log == []
    assert all(w.ready(m) == ["n1/cuda:0"] for m in ("busy", "q_big", "q_small", "never"))


def test_a_load_that_needs_memory_takes_the_idle_replicas_first_least_valuable_first() -> None:
    """new (5 GiB) needs 2 GiB more than the 3 GiB free: never (value 0) frees 1 GiB, then q_big
    (the least valuable per byte of the quiet ones) 2 GiB; q_small and busy stay."""
    w = idle_world()
    w.traffic.add("new", 10800.0)
    acts = w.tick(10800.5)
    assert [(type(a).__name__, a.model, a.kind) for a in acts] == [
        ("Evict", "never", "make_room"), ("Evict", "q_big", "make_room"), ("Preload", "new", "demand")]


def test_the_idle_budget_evicts_the_least_valuable_idle_replicas_until_within_it() -> None:
    """Budget 15 % of 10 GiB = 1.5 GiB for replicas with no expected demand; they hold 4 GiB.
    never (value 0) goes first → 3 GiB, still over; then q_big (half q_small's value per byte)
    → 1 GiB, within. q_small stays, and busy (expected demand) is not counted or touched."""
    w = idle_world(PolicyConfig(idle_memory_budget=0.15))
    acts = w.tick(10800.5)
    assert [(type(a).__name__, a.model, a.kind) for a in acts] == [
        ("Evict", "never", "idle_budget"), ("Evict", "q_big", "idle_budget")]
    assert "4.0 GiB" in acts[0].reason and "15%" in acts[0].reason and "never requested" in acts[0].reason
    assert acts[1].numbers["idle_gib"] == 3.0 and acts[1].numbers["budget_gib"] == pytest.approx(1.5)
    assert w.tick(10802.5) == []  # within the budget now
    assert w.ready("q_small") == ["n1/cuda:0"] and w.ready("busy") == ["n1/cuda:0"]


def test_where_first_requests_come_often_a_fill_outranks_a_quiet_resident() -> None:
    """idle_world, and ten 20 GiB models (too large to fill) never requested. For half an hour from 3 h, one of
    them gets its first request every 5 minutes: the first-request record (firsts.py) then values an
    unrequested model above q_big and q_small (requested once, 3 h ago). A first request for new (5 GiB, 3 GiB
    free) evicts q_big only and keeps never (the fill). With first_request_value off, never is worth 0 and goes
    first, then q_big, as in test_a_load_that_needs_memory_takes_the_idle_replicas_first_least_valuable_first."""
    def world(cfg: PolicyConfig) -> World:
        w = idle_world(cfg)
        w.models.update({f"u{i}": spec(f"u{i}", 20) for i in range(10)})
        arrivals = {10800 + 300 * (i + 1): [(f"u{i}", 1)] for i in range(6)}
        w.run(10800.0, 12600.0, arrivals)
        assert not any(isinstance(a, Evict) for _t, a in w.log)
        w.traffic.add("new", 12601.0)
        return w

    w = world(CFG)
    assert w.state is not None and w.state.firsts.rate() > 1e-4  # per second per unrequested model
    assert [(type(a).__name__, a.model) for a in w.tick(12601.5)] == [("Evict", "q_big"), ("Preload", "new")]
    w = world(PolicyConfig(first_request_value=False))
    assert [(type(a).__name__, a.model) for a in w.tick(12601.5)] == [
        ("Evict", "never"), ("Evict", "q_big"), ("Preload", "new")]


def test_while_fills_do_not_pay_the_fill_keeps_to_the_speculative_share() -> None:
    """fill_world(20): with fills evicted unasked on record (more than were asked for while resident), the fill's
    room is speculative_share (60 % = 12 GiB, 7 GiB after c) instead of all free memory (15 GiB)."""
    w = fill_world(20)
    assert [a.model for a in w.tick(0.0)] == ["c"]
    assert w.state is not None
    w.state.firsts.wasted = 6.0
    w.state.firsts.used = 2.0
    acts = w.tick(1.0)
    assert [a.model for a in acts] == ["b"] and acts[0].numbers["room_gib"] == pytest.approx(7.0)


def fill_world(gib: float, cfg: PolicyConfig = CFG) -> World:
    """One GPU and three models never requested: a (1 GiB, 3 s), b (2 GiB, 2 s), c (5 GiB, 1 s)."""
    return World([spec("a", 1, load_s=3.0), spec("b", 2, load_s=2.0), spec("c", 5, load_s=1.0)],
                 [gpu("n1/cuda:0", gib)], cfg=cfg)


def test_ample_free_memory_takes_unrequested_models_shortest_load_first_one_per_idle_link() -> None:
    """20 GiB: the fill's room is all free memory (fill_share; no fill outcome on record yet), which holds all
    three (8 GiB): c (the shortest load) at 0 s; while it loads the link is busy, so nothing more; then b at 1 s
    (c ready; 15 GiB free), a at 3 s (b ready)."""
    w = fill_world(20)
    assert [(a.model, a.kind) for a in w.tick(0.0)] == [("c", "fill")]
    assert w.tick(0.5) == []  # c loading: the link is not idle
    acts = w.tick(1.0)
    assert [(a.model, a.kind) for a in acts] == [("b", "fill")]
    assert acts[0].numbers["room_gib"] == pytest.approx(15.0) and "no request yet" in acts[0].reason
    assert [a.model for a in w.tick(3.0)] == ["a"]
    assert w.tick(6.0) == []


def test_where_memory_holds_some_unrequested_models_the_fill_takes_what_fits_shortest_load_first() -> None:
    """Issue 26, item 3. 6.5 GiB: room 6.5 GiB < the 8 GiB of unrequested models: c (5 GiB, the
    shortest load) at 0 s; 1.5 GiB left: b (2 GiB) does not fit, a (1 GiB) does, at 1 s; then nothing.
    On 20 GiB an idle-memory budget of 35 % (7 GiB) bounds it the same way: c, then b (2 GiB)."""
    w = fill_world(6.5)
    assert [(a.model, a.kind) for a in w.tick(0.0)] == [("c", "fill")]
    assert [(a.model, a.kind) for a in w.tick(1.0)] == [("a", "fill")]
    assert w.tick(4.0) == [] and w.tick(6.0) == []
    w = fill_world(20, PolicyConfig(idle_memory_budget=0.35))
    assert [a.model for a in w.tick(0.0)] == ["c"]
    assert [a.model for a in w.tick(1.0)] == ["b"]
    assert w.tick(3.0) == [] and w.tick(5.0) == []


def test_fill_replicas_are_the_first_victims_and_are_not_filled_again() -> None:
    """The fills c (5 GiB) and e (1 GiB) on a 10 GiB GPU (the fill held to 60 %: fill_share); e is then
    requested. A first request for d (5 GiB, 4 GiB free) evicts c (never requested: the first victim), not e.
    A model evicted unrequested is not filled again: on a fresh 20 GiB GPU with c's eviction on record the fill
    skips it."""
    w = World([spec("a", 1, load_s=3.0), spec("b", 2, load_s=2.0), spec("c", 5, load_s=1.0),
               spec("d", 5, load_s=1.0), spec("e", 1, load_s=1.0)], [gpu("n1/cuda:0", 10)],
              cfg=PolicyConfig(fill_share=0.6))
    assert [a.model for a in w.tick(0.0)] == ["c"]
    assert [a.model for a in w.tick(1.0)] == ["e"]
    w.traffic.add("e", 10.0)
    w.tick(10.0)
    w.traffic.add("d", 20.0)
    acts = w.tick(20.0)
    assert [(type(a).__name__, a.model, a.kind) for a in acts] == [
        ("Evict", "c", "make_room"), ("Preload", "d", "demand")]
    # c's room was needed before c was asked for: a wasted fill on the fill's record (e was asked for: used)
    assert w.state is not None and (round(w.state.firsts.used, 2), w.state.firsts.wasted) == (1.0, 1.0)
    w = fill_world(20)
    w.evicted_at["c"] = 0.0
    assert [a.model for a in w.tick(500.0)] == ["b"]


def yield_world(cfg: PolicyConfig = CFG) -> World:
    """One 20 GiB GPU; x (4 GiB, 8 s) and d (2 GiB, 9 s) never requested: the fill takes x (the shorter load)."""
    w = World([spec("x", 4, load_s=8.0), spec("d", 2, load_s=9.0)], [gpu("n1/cuda:0", 20)], cfg=cfg)
    assert [(a.model, a.kind) for a in w.tick(0.0)] == [("x", "fill")]
    return w


def test_a_fill_still_loading_gives_its_link_to_a_demand_load() -> None:
    """d is requested at 1 s while the fill of x loads on the only GPU: x's load is cancelled (an evict of kind
    "yield", which the worker and the simulator carry out on a load in flight) and d's demand load goes there,
    the link its own. With fill_yields off, d shares the link with x instead (links shared: SHARED). A load of a
    model that has been requested is no fill: it is never cancelled for another's demand."""
    w = yield_world()
    w.traffic.add("d", 1.0)
    acts = w.tick(1.0)
    assert [(type(a).__name__, a.model, a.kind, a.gpu) for a in acts] == [
        ("Evict", "x", "yield", "n1/cuda:0"), ("Preload", "d", "demand", "n1/cuda:0")]
    assert "never requested" in acts[0].reason and "d" in acts[0].reason
    assert w.held("x") == [] and w.evicted_at == {"x": 1.0}
    # a yield is no wasted fill: the fill's gate weighs memory, and x's room was not needed (firsts.py)
    assert w.state is not None and w.state.firsts.wasted == 0.0
    assert w.tick(2.0) == []  # x is on record as evicted: the fill does not take it again at once

    w = yield_world(PolicyConfig(fill_yields=False, link_wait=False))
    w.traffic.add("d", 1.0)
    assert [(type(a).__name__, a.model, a.kind) for a in w.tick(1.0)] == [("Preload", "d", "demand")]
    assert w.held("x") == ["n1/cuda:0"]

    w = yield_world(SHARED)
    w.traffic.add("x", 0.5)  # x is asked for while it loads: a demand of its own now
    w.traffic.add("d", 1.0)
    assert [(type(a).__name__, a.model, a.kind) for a in w.tick(1.0)] == [("Preload", "d", "demand")]
    assert w.held("x") == ["n1/cuda:0"]


def test_a_demand_load_takes_the_gpu_whose_link_carries_only_a_fill() -> None:
    """Two GPUs, each loading one model: a fill (x) on one, a requested model (r) on the other. A demand load
    for d counts the fill's link as idle (the fill gives way) and goes there, cancelling x; r's load, a demand,
    is left alone."""
    w = World([spec("x", 4, load_s=8.0), spec("r", 4, load_s=8.0), spec("d", 2, load_s=9.0)],
              [gpu("a/cuda:0", 20), gpu("b/cuda:0", 20)], cfg=PolicyConfig(fill_free_memory=False))
    w.traffic.add("r", 0.0)
    w.add_replica("x", "a/cuda:0", since=0.0, state="loading")
    w.add_replica("r", "b/cuda:0", since=0.0, state="loading")
    w.traffic.add("d", 1.0)
    acts = w.tick(1.0)
    assert [(type(a).__name__, a.model, a.kind, a.gpu) for a in acts] == [
        ("Evict", "x", "yield", "a/cuda:0"), ("Preload", "d", "demand", "a/cuda:0")]
    assert w.held("r") == ["b/cuda:0"]
    # a GPU whose link is idle goes first, though the fill's GPU is the tighter fit: no fill is cancelled
    # where none need be
    w = World([spec("x", 4, load_s=8.0), spec("d", 2, load_s=9.0)],
              [gpu("a/cuda:0", 20), gpu("b/cuda:0", 40)], cfg=PolicyConfig(fill_free_memory=False))
    w.add_replica("x", "a/cuda:0", since=0.0, state="loading")
    w.traffic.add("d", 1.0)
    assert [(type(a).__name__, a.model, a.gpu) for a in w.tick(1.0)] == [("Preload", "d", "b/cuda:0")]


def link_world(cfg: PolicyConfig) -> World:
    """One 20 GiB GPU whose link loads r (asked for, 8 s, since 0 s); d (9 s) is asked for at 1 s."""
    w = World([spec("r", 4, load_s=8.0), spec("d", 2, load_s=9.0)], [gpu("n1/cuda:0", 20)], cfg=cfg)
    w.traffic.add("r", 0.0)
    w.add_replica("r", "n1/cuda:0", since=0.0, state="loading")
    w.traffic.add("d", 1.0)
    return w


def test_a_demand_load_waits_for_a_busy_link_and_the_plan_wakes_when_it_frees() -> None:
    """PolicyConfig.link_wait: sharing r's link would slow r's load (its requests wait through it) and d's would end
    about when it would after r's: d waits (no preload), the state says so, and prewarm's policy asks to be woken
    when a load ends (wakes_on_ready). Once r is ready, d loads with the link its own. With the rule off, d shares
    the link at once."""
    cfg = PolicyConfig(fill_free_memory=False, link_wait=True)
    w = link_world(cfg)
    assert w.tick(1.0) == []
    assert w.state is not None and [(m, g) for m, g, _s in w.state.link_waits] == [("d", "n1/cuda:0")]
    # no action names the wait, so the leader's status does (PolicyState.link_wait_why)
    assert w.state.link_wait_why().startswith("1 demand load(s) wait for a busy link: d for n1/cuda:0's link")
    policy = PrewarmPolicy(cfg)
    policy.state = w.state
    assert policy.wakes_on_ready()
    assert [(type(a).__name__, a.model, a.kind) for a in w.tick(8.0)] == [("Preload", "d", "demand")]
    assert not w.state.link_waits and w.state.link_wait_why() == "" and w.ready("r") == ["n1/cuda:0"]

    w = link_world(replace(cfg, link_wait=False))
    assert [(type(a).__name__, a.model, a.gpu) for a in w.tick(1.0)] == [("Preload", "d", "n1/cuda:0")]
    assert w.state is not None and not w.state.link_waits


def test_pinned_model_is_never_evicted_even_when_idle_and_room_is_needed() -> None:
    w = World([spec("pin", 5, pinned=True), spec("x", 5), spec("y", 5)], [gpu("n1/cuda:0", 10)])
    w.add_replica("pin", "n1/cuda:0")
    arrivals = {s: [("x" if (s // 300) % 2 == 0 else "y", 1)] for s in range(0, 7200, 7)}
    w.run(0.0, 7200.0, arrivals)
    assert w.evictions("pin") == []
    assert w.held("pin") == ["n1/cuda:0"]
    assert w.evictions()  # x and y did have to take turns


def test_pinned_and_min_replicas_floor_is_restored() -> None:
    w = World([spec("pin", 1, pinned=True), spec("two", 1, min_replicas=2)],
              [gpu("a/cuda:0", 4), gpu("b/cuda:0", 4)])
    acts = w.tick(0.0)
    got = sorted((a.model, a.kind) for a in acts)
    assert got == [("pin", "min_replicas"), ("two", "min_replicas"), ("two", "min_replicas")]
    assert {a.gpu.split("/")[0] for a in acts if a.model == "two"} == {"a", "b"}


def test_replica_serving_a_request_is_not_evicted() -> None:
    w = World([spec("old", 4), spec("new", 4)], [gpu("n1/cuda:0", 4)])
    w.traffic.add("old", 0.0)
    w.add_replica("old", "n1/cuda:0")
    w.in_flight["old"] = 1
    w.traffic.add("new", 5000.0)
    assert w.tick(5000.5) == []  # nowhere to go: waits rather than evict a busy replica
    w.in_flight["old"] = 0
    kinds = [(type(a).__name__, a.model) for a in w.tick(5002.5)]
    assert kinds == [("Evict", "old"), ("Preload", "new")]


def test_capacity_is_never_exceeded_under_random_traffic() -> None:
    rnd = random.Random(7)
    models = [spec(f"m{i}", rnd.uniform(0.5, 9.0), load_s=rnd.uniform(2, 12)) for i in range(30)]
    w = World(models, [gpu("a/cuda:0", 12), gpu("a/cuda:1", 12), gpu("b/cuda:0", 16)])
    arrivals: dict[int, list[tuple[str, int]]] = {}
    for i, m in enumerate(models):
        period = 30 + 97 * i
        for s in range(rnd.randrange(period), 6 * 3600, period):
            arrivals.setdefault(s, []).append((m.id, 1 + rnd.randrange(3)))
    w.run(0.0, 6 * 3600.0, arrivals)  # World.tick asserts the budget after every tick
    assert len(w.preloads()) > 30 and w.evictions()
    # speculative bytes never above the share on any GPU
    for t, a in w.preloads(kind="speculative"):
        assert a.bytes <= CFG.speculative_share * w.gpus[a.gpu].total_bytes, t


def test_steady_noisy_traffic_does_not_flap() -> None:
    """Two models whose noisy steady traffic (Poisson, ~1 request / 20 s each) keeps both busy,
    on a GPU that holds both: after their first loads nothing is loaded or evicted again."""
    rnd = random.Random(3)
    w = World([spec("p", 3), spec("q", 3)], [gpu("n1/cuda:0", 8)])
    arrivals: dict[int, list[tuple[str, int]]] = {}
    for m in ("p", "q"):
        t = 0.0
        while t < 4 * 3600:
            t += rnd.expovariate(1 / 20.0)
            arrivals.setdefault(int(t), []).append((m, 1))
    w.run(0.0, 4 * 3600.0, arrivals)
    assert len(w.preloads()) == 2 and w.evictions() == []


def test_no_flapping_between_two_models_that_do_not_fit_together() -> None:
    """Two models alternate minute by minute on a GPU that holds one: every swap is a demand load
    (a request is waiting); no speculative reload happens within the cooldown of an eviction and
    nothing is evicted before min_residency_s."""
    w = World([spec("p", 5), spec("q", 5)], [gpu("n1/cuda:0", 8)])
    arrivals = {s: [("p" if (s // 60) % 2 == 0 else "q", 1)] for s in range(0, 3600, 10)}
    w.run(0.0, 3600.0, arrivals)
    loaded_at: dict[str, float] = {}
    for t, a in w.log:
        if isinstance(a, Preload):
            loaded_at[a.model] = t
            last_ev = w.evicted_at.get(a.model)
            if a.kind == "speculative" and last_ev is not None:
                assert t - last_ev >= CFG.eviction_cooldown_s
        else:
            assert t - loaded_at.get(a.model, -math.inf) >= CFG.min_residency_s


def test_replicas_spread_across_nodes() -> None:
    w = World([spec("hot", 2, max_rate_per_replica=1.0)],
              [gpu("a/cuda:0", 8), gpu("a/cuda:1", 8), gpu("b/cuda:0", 8), gpu("c/cuda:0", 8)])
    for s in range(-900, 0):  # a steady 3/s it has had for 15 minutes
        w.traffic.add_bucket("hot", s, 3)
    arrivals = {s: [("hot", 3)] for s in range(0, 600)}
    w.run(0.0, 600.0, arrivals)
    gpus = w.held("hot")
    assert len(gpus) == 3
    assert sorted(g.split("/")[0] for g in gpus) == ["a", "b", "c"]


def test_new_gpu_receives_the_hottest_models() -> None:
    models = [spec(f"m{i}", 1) for i in range(8)]
    w = World(models, [gpu("a/cuda:0", 16)])
    arrivals = {s: [(f"m{i}", 1 + i) for i in range(8)] for s in range(0, 300)}
    w.run(0.0, 300.0, arrivals)
    assert len(w.held("m0")) == 1
    w.gpus["b/cuda:0"] = gpu("b/cuda:0", 16, joined_at=301.0)
    acts = w.tick(302.0)
    new = sorted(a.model for a in acts if isinstance(a, Preload) and a.gpu == "b/cuda:0")
    assert new == ["m4", "m5", "m6", "m7"]  # the four hottest
    assert all(a.kind == "new_gpu" for a in acts)


def test_gpus_joining_together_share_the_hottest_models_instead_of_copying_them() -> None:
    models = [spec(f"m{i}", 1) for i in range(8)]
    w = World(models, [gpu("a/cuda:0", 16, joined_at=100.0), gpu("b/cuda:0", 16, joined_at=100.0)], cfg=SHARED)
    for s in range(0, 100):
        for i in range(8):
            w.traffic.add_bucket(f"m{i}", s, 1 + i)
    first = [a for a in w.tick(101.0) if isinstance(a, Preload)]
    # every model is wanted (demand): the four most valuable take the two load slots of each GPU,
    # the rest follow when those loads (4 s) are done; each is placed once, none copied
    assert sorted(a.model for a in first) == ["m4", "m5", "m6", "m7"]
    assert sorted(a.gpu for a in first) == ["a/cuda:0", "a/cuda:0", "b/cuda:0", "b/cuda:0"]
    assert w.tick(103.0) == []
    then = [a for a in w.tick(105.0) if isinstance(a, Preload)]
    assert sorted(a.model for a in first + then) == [f"m{i}" for i in range(8)]
    assert {a.gpu for a in then} == {"a/cuda:0", "b/cuda:0"}
    # a GPU joining this fleet later still receives the hottest models
    w.gpus["c/cuda:0"] = gpu("c/cuda:0", 16, joined_at=250.0)
    late = [a for a in w.tick(251.0) if isinstance(a, Preload) and a.kind == "new_gpu"]
    assert sorted(a.model for a in late) == ["m4", "m5", "m6", "m7"]


def test_speculative_loads_stay_within_the_speculative_share() -> None:
    """Twelve periodic models are all due at once on a 10 GiB GPU: speculative loads may take
    6 GiB of it (0.6), not more."""
    models = [spec(f"s{i}", 1, load_s=2.0) for i in range(12)]
    cfg = PolicyConfig(max_speculative_loads_per_gpu=100)
    w = World(models, [gpu("n1/cuda:0", 10)], cfg=cfg)
    for m in models:
        for k in range(10):
            w.traffic.add(m.id, k * 600.0)
    w.run(5400.0 + 200, 6000.0)
    spec_loads = w.preloads(kind="speculative")
    assert 1 <= len(spec_loads) and sum(a.bytes for _t, a in spec_loads) <= 0.6 * 10 * GIB


def test_plan_is_deterministic_and_state_is_only_a_cache() -> None:
    models = [spec(f"m{i}", 1 + i % 3) for i in range(10)]
    arrivals: dict[int, list[tuple[str, int]]] = {}
    rnd = random.Random(1)
    for i in range(10):
        for s in range(rnd.randrange(60), 4 * 3600, 60 * (i + 1)):
            arrivals.setdefault(s, []).append((f"m{i}", 1))
    class LiveStyle(World):  # rebuilds the catalog mapping every tick, as a live scheduler may
        def snapshot(self) -> Snapshot:
            s = super().snapshot()
            return Snapshot(dict(s.models), s.gpus, s.replicas, s.traffic,
                            recent_evictions=s.recent_evictions, config=s.config)

    logs = []
    # the no-regret layer's and the first-request records are the parts of the state that are not a cache (a
    # fresh state has no record): off here, so that everything else is shown to be one
    cfg = PolicyConfig(no_regret=False, first_request_value=False, fill_share=0.6)
    for cls, keep in ((World, True), (World, True), (World, False), (LiveStyle, True)):
        w = cls(models, [gpu("a/cuda:0", 6), gpu("b/cuda:0", 6)], cfg=cfg, keep_state=keep)
        w.run(0.0, 4 * 3600.0, arrivals)
        logs.append([(t, type(a).__name__, a.model, a.gpu, a.kind) for t, a in w.log])
    assert logs[0] == logs[1]  # deterministic
    assert logs[0] == logs[2]  # a kept state decides exactly as a fresh one
    assert logs[0] == logs[3]  # and so does a state that sees a new catalog object every tick


def test_expired_intents_are_ignored_and_live_ones_hold_memory() -> None:
    w = World([spec("a", 3), spec("b", 3)], [gpu("n1/cuda:0", 4)])
    w.traffic.add("b", 100.0)
    live = Intent("a", "n1/cuda:0", "preload", expires_at=200.0, bytes=3 * GIB)
    snap = w.snapshot()
    snap = Snapshot(snap.models, snap.gpus, snap.replicas, snap.traffic, intents=(live,), config=CFG)
    assert plan(snap, 100.5) == []  # the pending preload of a holds the room b would need
    expired = Intent("a", "n1/cuda:0", "preload", expires_at=100.0, bytes=3 * GIB)
    snap = Snapshot(snap.models, snap.gpus, snap.replicas, snap.traffic, intents=(expired,), config=CFG)
    assert [a.model for a in plan(snap, 100.5)] == ["b"]


# ---- traffic accumulator ------------------------------------------------------------------

def test_traffic_history_requests_and_buckets_agree() -> None:
    a = TrafficHistory()
    b = TrafficHistory()
    rnd = random.Random(5)
    per_second: dict[int, int] = {}
    t = 0.0
    for _ in range(2000):
        t += rnd.expovariate(0.2)
        a.add("m", t)
        per_second[int(t)] = per_second.get(int(t), 0) + 1
    for s in sorted(per_second):
        b.add_bucket("m", s, per_second[s])
    assert a.last_arrival("m") == b.last_arrival("m")
    assert a.stable_histogram("m") == b.stable_histogram("m")
    assert a.rate_short("m", t) == pytest.approx(b.rate_short("m", t))
    assert a.rate_long("m", t) == pytest.approx(b.rate_long("m", t))


def test_traffic_history_rates_histogram_and_bounded_memory() -> None:
    h = TrafficHistory()
    for k in range(5000):  # every 5 minutes
        h.add("p", k * 300.0)
    ver, hist, oob = h.stable_histogram("p")  # type: ignore[misc]
    assert oob == 0 and max(range(len(hist)), key=hist.__getitem__) == 5
    assert len(hist) == 240 and sum(hist) + oob <= 2 * 2048  # halved: bounded, proportions kept
    assert h.rate_long("p", 5000 * 300.0) == pytest.approx(1 / 300.0, rel=0.5)
    for s in range(600):
        h.add_bucket("q", s, 10)
    assert h.rate_short("q", 599) == pytest.approx(10.0, rel=0.01)
    # bias-corrected for the 600 s it has been seen: not read as 10 × (1 - 1/e)
    assert h.rate_long("q", 599) == pytest.approx(10.0, rel=0.02)
    assert h.changed_since(h.seq - 1) == ["q"]
    assert h.requests_per_active_minute("q") == pytest.approx(600.0)


def test_an_evicted_model_is_not_reloaded_for_requests_it_already_served() -> None:
    """A served a request at 195 and was evicted at 200 to make room for B's waiting request.
    A's request is recent but was served before the eviction: no demand reload of A (that
    would undo the eviction and thrash); a new request for A after the eviction is demand."""
    cfg = PolicyConfig(demand_window_s=60.0)  # A's request stays "recent" for the whole test
    w = World([spec("A", 3), spec("B", 3)], [gpu("n1/cuda:0", 4)], cfg=cfg)
    w.traffic.add("A", 100.0)
    w.traffic.add("A", 195.0)
    w.add_replica("A", "n1/cuda:0", since=100.0)
    w.traffic.add("B", 200.0)
    assert [(type(a).__name__, a.model) for a in w.tick(200.5)] == [("Evict", "A"), ("Preload", "B")]
    w.run(202.5, 228.5)  # B is ready and past its minimum residency: A could take its place
    assert w.preloads("A") == []
    w.traffic.add("A", 230.0)
    w.run(230.5, 240.5)
    assert [a.kind for _t, a in w.preloads("A")] == ["demand"]


def test_replica_of_a_model_dropped_from_the_catalog_is_evicted_first() -> None:
    w = World([spec("keep", 2), spec("new", 2)], [gpu("n1/cuda:0", 4)])
    w.traffic.add("keep", 0.0)
    w.traffic.add("gone", 0.0)
    w.add_replica("keep", "n1/cuda:0")
    w.replicas[("gone", "n1/cuda:0")] = ReplicaState("gone", "n1/cuda:0", "ready", 2 * GIB, -1e6)
    w.traffic.add("new", 50.0)
    kinds = [(type(a).__name__, a.model) for a in w.tick(50.5)]
    assert kinds == [("Evict", "gone"), ("Preload", "new")]
