"""The timeline's heaps hold the live segments, not every timeline a model ever had: a scheduler runs for
weeks, and each request in a new grid cell replaces its model's timeline (timeline.HEAP_SLACK, HEAP_FLOOR)."""

from __future__ import annotations

import random

from prewarm.domain.policy import PolicyConfig, PolicyState, plan
from prewarm.domain.policy.timeline import HEAP_FLOOR, HEAP_SLACK
from tests.unit.test_policy import World, gpu, spec

# the no-regret layer and the loads-ahead gate off: they are records, not caches (a fresh state has neither)
CFG = PolicyConfig(tick_s=30.0, no_regret=False, ahead_gate=False)


def _live(st: PolicyState, heap: list) -> int:
    return sum(1 for e in heap if st.scheduled.get(e[1]) == e[3])


def test_replaced_timelines_are_swept_from_the_heaps_and_decisions_stay_those_of_a_fresh_state() -> None:
    rnd = random.Random(3)
    models = [spec(f"m{i:02d}", 1 + i % 3, load_s=3.0 + i % 5) for i in range(60)]
    w = World(models, [gpu("a/cuda:0", 24), gpu("b/cuda:0", 24)], cfg=CFG)
    biggest = 0
    t = 0.0
    while t < 8 * 3600:
        for m in models:  # irregular gaps of 1-6 grid cells: a new anchor (a new timeline) nearly every time
            if rnd.random() < 0.9:
                w.traffic.add(m.id, t + rnd.uniform(0, CFG.tick_s))
        w.tick(t)
        st = w.state
        assert st is not None
        bound = HEAP_SLACK * len(st.scheduled) + HEAP_FLOOR
        for heap in (st.hot_heap, st.cold_heap):
            # swept at the call after it passes the bound: one call's pushes above it at most
            assert len(heap) <= bound + 32 * len(models)
            biggest = max(biggest, len(heap))
        t += CFG.tick_s
    st = w.state
    assert st is not None
    assert biggest > HEAP_FLOOR  # the run crossed the bound: without the sweep the cold heap only grows
    assert len(st.cold_heap) < biggest  # and was swept back
    assert _live(st, st.cold_heap) > 0  # keeping the live segments
    # the carried state, swept many times, plans as a fresh one would
    for k in range(3):
        now = t + k * CFG.tick_s
        snap = w.snapshot()
        assert [(type(x).__name__, x.model, x.gpu, x.kind) for x in plan(snap, now, st)] == \
               [(type(x).__name__, x.model, x.gpu, x.kind) for x in plan(snap, now, PolicyState())]
