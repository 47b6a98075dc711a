"""The policy's carried state (PolicyState) through catalogs that change: a state carried from tick to tick
decides exactly as a fresh one, and a changed spec reschedules that model's timeline, not every model's."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from prewarm.domain.policy import GIB, PolicyConfig, PolicyState, plan
from tests.unit.test_policy import World, gpu, spec

# the no-regret layer off: its record is the one part of the state that is not a cache (a fresh state has none)
# the no-regret layer and the loads-ahead record are records, not caches: a fresh state has neither
# the records that are not caches (the no-regret layer's, the loads-ahead and first-request records: a fresh state
# has none) are off, so that the rest is shown to be a cache
CFG = PolicyConfig(tick_s=6.0, no_regret=False, ahead_gate=False, first_request_value=False, fill_share=0.6)


def _traffic(rnd: random.Random, models: list[str], seconds: int) -> dict[int, list[tuple[str, int]]]:
    """Per-second counts: periodic models (some twice in one grid cell, so a histogram refresh can
    come without a new anchor), bursty ones, and a sparse tail."""
    out: dict[int, list[tuple[str, int]]] = {}
    for i, m in enumerate(models):
        kind = i % 4
        if kind == 0:  # periodic, every 4-16 minutes, sometimes a second request a few seconds later
            period = 240 * (1 + i % 4)
            for s in range(rnd.randrange(period), seconds, period):
                out.setdefault(s, []).append((m, 1))
                if rnd.random() < 0.3 and s + 3 < seconds:
                    out.setdefault(s + 3, []).append((m, 1))
        elif kind == 1:  # bursts: a few minutes busy, then quiet for a while
            s = rnd.randrange(600)
            while s < seconds:
                for k in range(s, min(seconds, s + rnd.randrange(60, 240)), rnd.randrange(1, 8)):
                    out.setdefault(k, []).append((m, rnd.randrange(1, 4)))
                s += rnd.randrange(900, 2400)
        elif kind == 2:  # Poisson, one request every ~2 minutes
            s = rnd.expovariate(1 / 120)
            while s < seconds:
                out.setdefault(int(s), []).append((m, 1))
                s += rnd.expovariate(1 / 120)
        elif rnd.random() < 0.5:  # the tail: a handful of requests, or none at all (fill candidates)
            for _ in range(rnd.randrange(1, 4)):
                out.setdefault(rnd.randrange(seconds), []).append((m, 1))
    return out


class Catalog:
    """The catalog as a live scheduler's reader sees it: a spec changes (mostly a model's measured load
    time), gets pinned or a floor, leaves the catalog or joins it; every change gives a new mapping, and a
    tick with no change hands the same mapping back (as scheduler.snapshot does)."""

    def __init__(self, rnd: random.Random, models: list, spare: list) -> None:
        self.rnd = rnd
        self.all = {m.id: m for m in models + spare}
        self.now = {m.id: m for m in models}
        self.changes = 0

    def step(self) -> dict | None:
        """The next tick's mapping, or None: unchanged."""
        rnd = self.rnd
        new = dict(self.now)
        x = rnd.random()
        if x < 0.5:  # a load measured: its median moves (a few models at once, now and then)
            for m in rnd.sample(sorted(new), 1 if rnd.random() < 0.8 else 3):
                s = new[m]
                new[m] = replace(s, load_seconds=round((s.load_seconds or 4.0) * rnd.uniform(0.6, 1.6), 2) + 0.5)
        elif x < 0.53:
            m = rnd.choice(sorted(new))
            new[m] = replace(new[m], pinned=not new[m].pinned)
        elif x < 0.56:
            m = rnd.choice(sorted(new))
            new[m] = replace(new[m], min_replicas=1 - new[m].min_replicas)
        elif x < 0.58 and len(new) > 20:  # leaves the catalog
            del new[rnd.choice(sorted(new))]
        elif x < 0.60:  # joins (again): with its last spec
            gone = sorted(set(self.all) - set(new))
            if gone:
                m = rnd.choice(gone)
                new[m] = self.all[m]
        elif x < 0.62:  # a new object with the same spec: not a change
            m = rnd.choice(sorted(new))
            new[m] = replace(new[m])
        else:
            return None
        self.all.update(new)
        self.changes += 1
        self.now = new
        return new


# short of memory (evictions, the quiet ones first; speculative loads), and ample (fills of unrequested models)
@pytest.mark.parametrize(("gib", "expected"), [
    (14, {("Evict", "make_room"), ("Preload", "demand"), ("Preload", "speculative"), ("Preload", "min_replicas")}),
    (40, {("Preload", "fill"), ("Preload", "demand"), ("Preload", "min_replicas")}),
])
def test_a_carried_state_decides_as_a_fresh_one_while_specs_change(gib: int, expected: set) -> None:
    rnd = random.Random(7)
    models = [spec(f"m{i:02d}", 1 + i % 4, load_s=2.0 + (i * 7) % 19) for i in range(36)]
    spare = [spec(f"new{i}", 2, load_s=5.0) for i in range(4)]
    hours = 3
    arrivals = _traffic(rnd, [m.id for m in models + spare], hours * 3600)
    gpus = [gpu("a/cuda:0", gib), gpu("a/cuda:1", gib), gpu("b/cuda:0", gib)]
    carried = World(models, gpus, cfg=CFG)
    fresh = World(models, gpus, cfg=CFG)  # given a new PolicyState before every tick
    catalog = Catalog(random.Random(11), models, spare)
    t, sec = 0.0, 0
    while t <= hours * 3600:
        while sec <= t:
            for model, count in arrivals.get(sec, []):
                carried.traffic.add_bucket(model, sec, count)
                fresh.traffic.add_bucket(model, sec, count)
            sec += 1
        new = catalog.step()
        if new is not None:
            carried.models = new
            fresh.models = new
        fresh.state = PolicyState()
        a, b = carried.tick(t), fresh.tick(t)
        assert [(type(x).__name__, x.model, x.gpu, x.kind, x.reason) for x in a] == \
               [(type(x).__name__, x.model, x.gpu, x.kind, x.reason) for x in b], f"at {t}"
        # and the timeline behind them: hot and cold segments now, recent arrivals, the fill's list, floors
        c, f = carried.state, fresh.state
        assert c is not None and f is not None
        assert {m: x for m, x in c.awake.items() if x[0] > t} == f.awake, f"at {t}"
        assert (c.due, c.recent, c.special, c.unrequested) == (f.due, f.recent, f.special, f.unrequested), f"at {t}"
        t += CFG.tick_s
    # the run exercised what the state feeds: speculative loads, victims' order, fills, floors
    kinds = {(type(x).__name__, x.kind) for _t, x in carried.log}
    assert expected <= kinds, kinds
    assert catalog.changes > 500


def test_a_changed_spec_reschedules_only_its_own_timeline() -> None:
    models = {f"m{i}": spec(f"m{i}", 1, load_s=4.0) for i in range(20)}
    w = World(list(models.values()), [gpu("a/cuda:0", 40)], cfg=CFG)
    for i in range(20):
        for k in range(12):
            w.traffic.add(f"m{i}", 100.0 + k * 300.0 + i)
    w.tick(4000.0)
    st = w.state
    assert isinstance(st, PolicyState)
    before = dict(st.scheduled)
    assert len(before) == 20
    w.models = {**w.models, "m3": replace(w.models["m3"], load_seconds=30.0)}
    w.tick(4006.0)
    after = st.scheduled
    # every other model's timeline is the one scheduled before (the very object), m3's is new
    assert [m for m in before if after[m] is not before[m]] == ["m3"]
    assert after["m3"][1][1] == 30.0
    # and what the carried state plans next matches a fresh state's
    assert [(type(a).__name__, a.model, a.gpu) for a in plan(w.snapshot(), 4012.0, st)] == \
           [(type(a).__name__, a.model, a.gpu) for a in plan(w.snapshot(), 4012.0)]
    assert sum(r.bytes for r in w.replicas.values()) <= 40 * GIB


def test_a_replica_that_appears_in_a_quiet_stretch_is_quiet_at_once() -> None:
    """A model in a cold stretch of its timeline with no replica (an operator evicted it), then one
    appears without a request of its own (an operator's preload): a fresh state sees it quiet (the first victim), and so does the
    carried state that saw the model without a replica on the ticks before."""
    w = World([spec("q", 1), spec("busy", 1)], [gpu("a/cuda:0", 8)], cfg=CFG)
    for k in range(6):
        w.traffic.add("q", 100.0 + 40.0 * k)
    for t in range(0, 8000, 6):
        if t == 3000:  # an operator's evict
            for key in [k for k in w.replicas if k[0] == "q"]:
                del w.replicas[key]
        w.traffic.add("busy", float(t))
        w.tick(float(t))
    assert not w.held("q")
    w.add_replica("q", "a/cuda:0")  # an operator's preload
    for now in (8000.0, 8006.0):
        w.tick(now)
        fresh = PolicyState()
        plan(w.snapshot(), now, fresh)
        assert w.state is not None and "q" in fresh.due  # the precondition: q is in a quiet stretch
        assert w.state.due == fresh.due
