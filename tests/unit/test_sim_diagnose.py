"""The diagnostic replay (simulator/diagnose.py): each cold start's class on a tiny trace worked out by hand."""

from __future__ import annotations

import numpy as np

from simulator.diagnose import DiagnosticSimulation, diagnose
from simulator.policies import POLICIES
from simulator.trace import GIB

from .test_sim import trace


def test_cold_starts_split_by_cause_and_state_by_hand() -> None:
    # One 10 GiB GPU, a and b 6 GiB each (they never fit together), 5 s loads, LRU, no contention.
    # a@0: first request, no load yet -> first/none; its load runs 0-5 s.
    # a@2: during that load -> first/loading; both are served at 5 s (a's last request: 5 s).
    # b@10: first/none; no room, so LRU evicts a (idle 10 - 5 = 5 s) for b's demand load (10-15 s).
    # a@20: a returns 10 s after its eviction with no replica -> eviction/none; b is evicted (idle 5 s).
    # a@22: during a's reload (20-25 s) -> eviction/loading. b is never asked for again.
    tr = trace([(0.0, "a"), (2.0, "a"), (10.0, "b"), (20.0, "a"), (22.0, "a")])
    sizes = np.array([6 * GIB, 6 * GIB], dtype=np.int64)
    loads = np.array([5.0, 5.0])
    sim = DiagnosticSimulation(tr, sizes, loads, 1, 10 * GIB, "none")
    out = diagnose(sim, POLICIES["on-demand-lru"]())
    assert out["cold_starts"] == 5
    assert out["classes"] == {"first/none": 2, "first/loading": 1, "eviction/none": 1, "eviction/loading": 1}
    assert out["evictions"] == 2 and out["evictions_with_cold"] == 1 and out["cold_after_eviction"] == 2
    assert out["costly_return_s"]["p50"] == 10.0  # a: evicted at 10 s, back at 20 s
    assert out["costly_idle_s"]["p50"] == 5.0
    assert out["evictions_by_load_kind"] == {"demand": 2}
    assert out["returns_by_timeline"] == {}  # only prewarm has a timeline to ask
    assert out["returns_requests_per_day_by_timeline"] == {}
    # the memory check: one window, both models asked for, 12 GiB of a 10 GiB fleet
    assert out["memory"]["fleet_gib"] == 10.0 and out["memory"]["active_per_1h_over_fleet"]["p50"] == 1.2


def test_prewarm_returns_are_split_by_its_timeline() -> None:
    # prewarm on a short trace: every return after an eviction is asked where its timeline stood
    events = [(float(t), m) for t in range(0, 600, 30) for m in ("a", "b")]
    tr = trace(events)
    sim = DiagnosticSimulation(tr, np.array([6 * GIB, 6 * GIB], dtype=np.int64), np.array([5.0, 5.0]),
                               1, 10 * GIB, "none")
    out = diagnose(sim, POLICIES["prewarm"]())
    returns = sum(out["returns_by_timeline"].values())
    assert returns == out["classes"].get("eviction/none", 0)
    assert out["cold_starts"] == sum(out["classes"].values())
    # each such return's model (a or b) has 20 requests that day, whatever its timeline label
    assert returns > 0
    for q in out["returns_requests_per_day_by_timeline"].values():
        assert q == {"p10": 20.0, "p25": 20.0, "p50": 20.0, "p75": 20.0, "p90": 20.0}
    assert set(out["returns_requests_per_day_by_timeline"]) == {
        k.split("+")[0] for k in out["returns_by_timeline"]}
