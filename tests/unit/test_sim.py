"""Simulator tests: each baseline on a tiny trace whose cold starts and evictions are worked out
by hand in the comments, the fleet model (load-link contention), formats, determinism, the CLI."""

from __future__ import annotations

import heapq
import json
import math
from collections import Counter

import numpy as np
import pytest

from prewarm.domain.policy import PolicyConfig, Stage, Unstage
from simulator.cli import main as cli_main
from simulator.cli import simulate
from simulator.engine import Simulation
from simulator.fleet import HostCopy
from simulator.policies import POLICIES, _Base
from simulator.trace import GIB, Trace, load_azure_minute, load_requests


def trace(events: list[tuple[float, str]], span: float | None = None) -> Trace:
    names: list[str] = []
    for _t, m in events:
        if m not in names:
            names.append(m)
    times = np.array([t for t, _m in events], dtype=float)
    mids = np.array([names.index(m) for _t, m in events], dtype=np.int32)
    order = np.argsort(times, kind="stable")
    return Trace(names, times[order], mids[order], span if span is not None else float(times.max()), "test", "requests")


def run(policy: str, events: list[tuple[float, str]], sizes_gib: dict[str, float], load_s: dict[str, float],
        gpus: int = 1, gpu_gib: float = 2.0, contention: str = "none", span: float | None = None,
        config: PolicyConfig | None = None) -> Simulation:
    tr = trace(events, span)
    sizes = np.array([int(sizes_gib[m] * GIB) for m in tr.models], dtype=np.int64)
    loads = np.array([load_s[m] for m in tr.models], dtype=float)
    sim = Simulation(tr, sizes, loads, gpus, int(gpu_gib * GIB), contention)
    sim.run(POLICIES[policy]() if config is None else POLICIES[policy](config))  # type: ignore[call-arg]
    return sim


ONE = {"A": 1.0, "B": 1.0, "C": 1.0}
FAST = {"A": 1.0, "B": 1.0, "C": 1.0}


def test_on_demand_lru_by_hand() -> None:
    # 2 GiB holds two of A, B, C (1 GiB each, 1 s loads).
    # A@0 cold; B@10 cold; A@20 warm; C@30 cold, evicts LRU B (A used at 20);
    # B@40 cold, evicts A (last 20; C's last use is its request's arrival, 30);
    # A@50 cold, evicts C (30 < B's 40). 5 cold, 3 evictions, each waits its 1 s load.
    sim = run("on-demand-lru", [(0, "A"), (10, "B"), (20, "A"), (30, "C"), (40, "B"), (50, "A")], ONE, FAST)
    assert sim.cold == 5 and sim.evictions == 3 and sim.loads == 5
    assert sim.waits == [1.0] * 5
    assert sorted(sim.gpus[0].residents) == [0, 1]  # A and B resident at the end


def test_lru_counts_a_use_at_the_requests_arrival_not_at_its_loads_end() -> None:
    # 2 GiB holds two of A, B, C (1 GiB each); no link sharing. A@0 loads 20 s (ready 20), B@1 loads
    # 2 s (ready 3). C@30 needs a victim among the ready A and B: a use is a request's arrival, A's 0
    # and B's 1, so A goes; B@40 is warm. 3 cold starts, 1 eviction (A at 30). Ranked by when each load
    # ended (A 20, B 3) B would go and B@40 be cold (4).
    events = [(0, "A"), (1, "B"), (30, "C"), (40, "B")]
    sim = run("on-demand-lru", events, ONE, {"A": 20.0, "B": 2.0, "C": 1.0})
    assert sim.cold == 3 and sim.loads == 3
    assert sim.last_evicted == {0: 30.0}
    assert sorted(sim.gpus[0].residents) == [1, 2]  # B and C


def test_lru_never_evicts_a_replica_still_loading_and_a_request_during_its_load_waits_for_it() -> None:
    # 2 GiB holds two of A, B, C (1 GiB each); no link sharing. A@0 loads 100 s (ready 100), B@1 loads 1 s
    # (ready 2). C@10 needs a victim: A's last use (0) is older than B's (1), but A is still loading, so
    # the ready B goes (at 10); C loads 10 -> 11. A@50 arrives while A loads: it waits for that load (a
    # cold start, no second load). 4 cold starts, 3 loads, 1 eviction; A's two requests wait 100 and 50 s.
    events = [(0, "A"), (1, "B"), (10, "C"), (50, "A")]
    sim = run("on-demand-lru", events, ONE, {"A": 100.0, "B": 1.0, "C": 1.0})
    assert sim.cold == 4 and sim.loads == 3
    assert sim.last_evicted == {1: 10.0}
    assert sorted(sim.waits) == [1.0, 1.0, 50.0, 100.0]
    assert sorted(sim.gpus[0].residents) == [0, 2]  # A and C


def test_keepalive_10m_by_hand() -> None:
    # A@0 cold (ready at 1); A@500 warm (idle 499 s); A@1200: idle since 500 is 700 s > 600 s,
    # so A was unloaded at 1100 → cold. 2 cold, 1 eviction (the keep-alive), 2 loads.
    sim = run("keepalive-10m", [(0, "A"), (500, "A"), (1200, "A")], ONE, FAST, span=1300)
    assert sim.cold == 2 and sim.loads == 2
    assert sim.evictions == 1 and sim.last_evicted[0] == pytest.approx(1100.0)


def test_seed_pool_evicts_oldest_loaded_not_least_recent() -> None:
    # A@0 (loaded at 0), B@10 (loaded at 10), A@20 warm; C@30 evicts the oldest-loaded, A,
    # although A was used more recently than B; A@40 cold again, evicts B (loaded at 10).
    # 4 cold. Under LRU, C would evict B and A@40 would be warm (3 cold).
    events = [(0, "A"), (10, "B"), (20, "A"), (30, "C"), (40, "A")]
    sim = run("seed-pool", events, ONE, FAST)
    assert sim.cold == 4 and sim.evictions == 2
    assert run("on-demand-lru", events, ONE, FAST).cold == 3


def test_faascache_greedy_dual_by_hand() -> None:
    # Sizes 1 GiB; load (cost) A 1 s, B 4 s, C 1 s; 2 GiB.
    # A@0: freq 1, prio = 0 + 1·1/1 = 1.  B@10: prio = 0 + 1·4/1 = 4.
    # C@30: evict the lowest, A (1); clock = 1; C prio = 1 + 1·1 = 2.
    # A@40: evict C (2 < 4); clock = 2; A's frequency was reset on eviction: prio = 2 + 1 = 3.
    # B@50: warm (B's high cost kept it). 4 cold, evictions A then C.
    # LRU on the same trace evicts B at 40 (older than C) and B@50 is cold: 5 cold.
    events = [(0, "A"), (10, "B"), (30, "C"), (40, "A"), (50, "B")]
    loads = {"A": 1.0, "B": 4.0, "C": 1.0}
    sim = run("faascache", events, ONE, loads)
    assert sim.cold == 4 and sim.evictions == 2
    assert sorted(sim.gpus[0].residents) == [0, 1]  # A and B
    assert run("on-demand-lru", events, ONE, loads).cold == 5


def test_hybrid_histogram_prewarms_a_periodic_model() -> None:
    # A every 300 s from 0 to 3000 (11 calls). Fewer than 5 idle times: 4-hour keep-alive, so
    # calls 2..6 are warm. From the 6th call (t=1500; 5 idle times, all in bin 5, CV >> 2):
    # pre-warm = 0.9 × 300 = 270 s, keep-alive = 1.1 × 360 − 270 = 126 s: unload after each call,
    # reload its 1 s load before call + 270, call + 300 is warm. 1 cold start; loads: the first +
    # reloads at 1769, 2069, 2369, 2669, 2969 (3269 is past the trace): 6; evictions: at 1500..3000: 6.
    events = [(300.0 * k, "A") for k in range(11)]
    sim = run("hybrid-histogram", events, ONE, FAST, span=3000)
    assert sim.cold == 1
    assert sim.loads == 6
    assert sim.evictions == 6


def test_hybrid_histogram_keeps_a_replica_whose_pre_warm_window_is_shorter_than_its_load() -> None:
    # A every 300 s from 0 to 3000, its load 280 s. From the call at 1500 the windows are those of the
    # test above (pre-warm 270 s, keep-alive 126 s), but a reload would have to start 280 s before
    # call + 270, i.e. before the call is served: nothing to gain by unloading, A stays. 1 cold start
    # (the first), 1 load, no eviction. (Unloaded and reloaded at call + 270, every call from 1800 on
    # would find the reload in flight: 6 cold.)
    events = [(300.0 * k, "A") for k in range(11)]
    sim = run("hybrid-histogram", events, ONE, {"A": 280.0}, span=3000)
    assert sim.cold == 1 and sim.loads == 1 and sim.evictions == 0


def test_hybrid_histogram_starts_the_reload_its_load_time_before_the_pre_warm_window_ends() -> None:
    # As above with a 40 s load: from the call at t = 1500 on, A is unloaded after each call and its
    # reload starts at t + 270 − 40, ready at t + 270 (the window's end), so call t + 300 is warm:
    # reloads sent at 1730, 2030, 2330, 2630, 2930, 3230, each ready 40 s later. 1 cold start. (Sent at
    # t + 270, each would be ready at t + 310, after the next call: 6 cold.) The keep-alive runs from the
    # window's end, to t + 270 + 126: the last reload (ready 3270) would be unloaded at 3396, but the
    # 4-hour keep-alive of the first calls armed the model's timer for 14,400, past the trace.
    events = [(300.0 * k, "A") for k in range(11)]
    reloads: list[tuple[float, float]] = []

    class Watch(POLICIES["hybrid-histogram"]):  # type: ignore[misc, valid-type]
        def on_ready(self, t: float, r) -> None:
            if r.kind == "prewarm":
                reloads.append((r.since, t))
            super().on_ready(t, r)

    tr = trace(events, 3500)
    sim = Simulation(tr, np.array([GIB]), np.array([40.0]), 1, 2 * GIB, "none")
    sim.run(Watch())
    assert sim.cold == 1
    assert sim.evictions == 6 and sim.last_evicted[0] == pytest.approx(3000.0)
    assert reloads == [(t + 230.0, t + 270.0) for t in (1500.0, 1800.0, 2100.0, 2400.0, 2700.0, 3000.0)]


def test_hybrid_histogram_decides_a_cold_call_when_its_load_ends() -> None:
    # One 1 GiB GPU, A (1 GiB, 150 s load) every 300 s from 0 to 1500 and B (1 GiB, 1 s) at 150 + 300 k
    # up to 1350: each evicts the other, so every call is cold and A is served 150 s after each call.
    # A's call at 1500 has the windows above (pre-warm 270 s, keep-alive 126 s) and is served at 1650:
    # its reload would start at 1500 + 270 − 150 = 1620, before that, so A is kept (no unload at 1650,
    # no reload). Loads: 6 of A + 5 of B; evictions: the 10 each call makes for itself.
    events = [(300.0 * k, "A") for k in range(6)] + [(150.0 + 300.0 * k, "B") for k in range(5)]
    sim = run("hybrid-histogram", events, {"A": 1.0, "B": 1.0}, {"A": 150.0, "B": 1.0}, gpu_gib=1.0,
              span=1800)
    assert sim.cold == 11
    assert sim.loads == 11 and sim.evictions == 10
    assert sorted(sim.gpus[0].residents) == [0]  # A, ready since 1650


def test_hybrid_histogram_pre_warm_reload_never_evicts_what_was_used_after_its_call() -> None:
    # One 2 GiB GPU; A, B, C 1 GiB, 1 s loads, no link sharing. A every 300 s from 0 to 2100: from its call
    # at 1500 the windows are pre-warm 270 s, keep-alive 126 s (as above), so A is unloaded at 1500 and its
    # reload is due at 1500 + 270 - 1 = 1769. B@1600 and C@1700 (first calls: 4-hour keep-alive) fill the
    # GPU, both used after A's call at 1500: the reload may evict neither, it is not sent, and B@1790 is warm.
    # A@1800 is cold: a load on demand evicts the least recently used, C (1700 < B's 1790), A ready at
    # 1801 and unloaded again (its reload due at 2069 > 1801); at 2069 there is room (B alone), the
    # reload goes, and A@2100 is warm (then unloaded, its next reload past the trace). Cold: A@0, B, C,
    # A@1800 = 4; loads: A, B, C, A, A's reload = 5; evictions: A@1500, C@1800, A@1801, A@2100.
    # (A reload that evicted by plain LRU would have unloaded B at 1769, and B@1790 been cold.)
    events = [(300.0 * k, "A") for k in range(8)] + [(1600.0, "B"), (1700.0, "C"), (1790.0, "B")]
    sim = run("hybrid-histogram", events, ONE, FAST, span=2200)
    assert sim.cold == 4 and sim.loads == 5 and sim.evictions == 4
    assert sim.last_evicted == {0: 2100.0, 2: 1800.0}  # B (1) never evicted
    assert sorted(sim.gpus[0].residents) == [1]


def test_hybrid_histogram_pre_warm_reload_evicts_what_was_last_used_before_its_call() -> None:
    # As above, but C@1400 (before A's call at 1500) and B@1600 fill the GPU. At 1769 A's reload evicts
    # C (last used 1400 < 1500: as LRU would have, had A stayed loaded), A ready at 1770, A@1800 warm;
    # unloaded after it (reload due 2069, room: B alone), reloaded, A@2100 warm. Cold: A@0, C, B = 3;
    # loads: A, C, B, A@1769, A@2069 = 5; evictions: A@1500, C@1769, A@1800, A@2100.
    events = [(300.0 * k, "A") for k in range(8)] + [(1400.0, "C"), (1600.0, "B")]
    sim = run("hybrid-histogram", events, ONE, FAST, span=2200)
    a, c = sim.trace.models.index("A"), sim.trace.models.index("C")
    assert sim.cold == 3 and sim.loads == 5 and sim.evictions == 4
    assert sim.last_evicted == {a: 2100.0, c: 1769.0}


def test_hybrid_histogram_out_of_bounds_uses_the_idle_time_forecaster() -> None:
    # A every 5 h: every idle time is out of the 4-hour range. Calls at 0..20 h see fewer than 5
    # idle times: 4-hour keep-alive, unloaded before the next call → all cold, and so is 25 h.
    # At 25 h there are 5 idle times, all out of bounds: predicted idle = 5 h, so A is unloaded
    # after the call and loaded from 25 + 4.25 h to 25 + 5.75 h → the call at 30 h is warm.
    # 6 cold in 7 calls; loads: 6 on demand + 1 pre-warm.
    h = 3600.0
    events = [(5 * h * k, "A") for k in range(7)]
    sim = run("hybrid-histogram", events, ONE, FAST, span=31 * h)
    assert sim.cold == 6
    assert sim.loads == 7


def test_oracle_prefetches_and_evicts_farthest_next_use() -> None:
    # A@0 cold (its prefetch would start at −1, clamped to 0: waits 1 s). B: prefetched at 9,
    # ready at 10 → warm. C: prefetched at 19 evicting B (next use 40, farther than A's 30).
    # A@30 warm. B: prefetched at 39 evicting A (no next use). C@50 warm. 1 cold, 2 evictions.
    # LRU on the same trace: all 6 cold.
    events = [(0, "A"), (10, "B"), (20, "C"), (30, "A"), (40, "B"), (50, "C")]
    sim = run("oracle", events, ONE, FAST)
    assert sim.cold == 1 and sim.evictions == 2 and sim.loads == 4
    assert run("on-demand-lru", events, ONE, FAST).cold == 6


def test_oracle_is_a_floor_without_contention() -> None:
    rng = np.random.default_rng(3)
    events = [(float(t), f"m{int(m)}") for t, m in zip(np.sort(rng.uniform(0, 3600, 400)),
                                                         rng.integers(0, 12, 400), strict=True)]
    sizes = {f"m{i}": 0.5 + (i % 4) * 0.5 for i in range(12)}
    loads = {f"m{i}": 2.0 + i % 3 for i in range(12)}
    colds = {p: run(p, events, sizes, loads, gpus=2, gpu_gib=3.0).cold for p in POLICIES}
    assert colds["oracle"] == min(colds.values())


def test_prewarm_goes_through_plan_and_serves_every_request() -> None:
    events = [(float(t), "A") for t in range(0, 600, 7)] + [(5.0, "B"), (400.0, "B")]
    sim = run("prewarm", events, {"A": 1.0, "B": 1.0}, {"A": 2.0, "B": 2.0}, gpu_gib=4.0)
    # A's first request (at 0 s, while A, the first fill load at the 0 s tick, is loading); B was
    # loaded into the free memory before its first request (at 5 s) and stays (room to spare)
    assert sim.cold == 1
    assert all(np.isfinite(sim.waits))
    assert sim.policy.actions >= 2  # type: ignore[union-attr]


def test_a_tick_plans_once_while_a_demand_load_waits_for_a_busy_link() -> None:
    """While a demand load waits for a busy link (PolicyConfig.link_wait), prewarm's plan is woken when a load ends
    (wakes_on_ready); the engine's retry of stalled misses right after a tick is not such an end, and plans nothing
    the tick's plan did not see: as live, one plan per tick. A (1 GiB, 10 s) loads at 0 s; B (1 GiB, 100 s) is
    asked for at 1 s and waits for A's link rather than share it until A ends at 10 s."""
    calls: list[float] = []  # the instants prewarm planned at
    waited: list[float] = []

    class Counting(POLICIES["prewarm"]):  # type: ignore[misc,valid-type]
        def _plan(self, t: float) -> None:
            calls.append(t)
            super()._plan(t)
            if self.state.link_waits:
                waited.append(t)

    tr = trace([(0.0, "A"), (1.0, "B"), (300.0, "A")])
    sim = Simulation(tr, np.array([GIB, GIB], dtype=np.int64), np.array([10.0, 100.0]), 1, 2 * GIB, "shared")
    sim.run(Counting(PolicyConfig(fill_free_memory=False)))
    assert waited and min(waited) < 4.0 <= max(waited)  # the premise: B waited for the link across ticks
    assert sim.cold == 2 and all(np.isfinite(sim.waits))
    # each tick while B waits, once (before: twice); 0 s has A's miss beside the tick, 10 s A's end
    assert [Counter(calls)[t] for t in (2.0, 4.0, 6.0, 8.0)] == [1, 1, 1, 1]


def test_requests_still_waiting_when_the_trace_ends_are_served_by_later_ticks() -> None:
    """A and B (1 GiB, 10 s loads) are asked for at 99.5 s of a 100 s trace on a 1 GiB GPU. A loads
    on its miss; B waits: A is ready at 109.5 s and evictable at 109.5 + 10 (min residency), so the
    tick at 110 s evicts it and loads B, ready at 120 s. Before, ticks stopped at the trace's end and
    B's request counted as never served. (No fill: it would have loaded A or B into the empty GPU long before.)"""
    sim = run("prewarm", [(99.5, "A"), (99.5, "B")], {"A": 1.0, "B": 1.0}, {"A": 10.0, "B": 10.0},
              gpu_gib=1.0, span=100.0, config=PolicyConfig(fill_free_memory=False))
    assert sim.results()["unserved"] == 0
    assert sorted(sim.waits) == pytest.approx([10.0, 20.5])


def test_loads_share_a_gpus_bandwidth() -> None:
    # A and B (4 s loads) requested together on one GPU: shared link → both ready at 8 s;
    # without contention → 4 s. On two GPUs they do not slow each other.
    events = [(0.0, "A"), (0.0, "B")]
    loads = {"A": 4.0, "B": 4.0}
    assert run("on-demand-lru", events, ONE, loads, contention="shared").waits == [8.0, 8.0]
    assert run("on-demand-lru", events, ONE, loads, contention="none").waits == [4.0, 4.0]
    assert run("on-demand-lru", events, ONE, loads, gpus=2, contention="shared").waits == [4.0, 4.0]


def test_requests_during_a_load_wait_for_the_remainder() -> None:
    sim = run("on-demand-lru", [(0.0, "A"), (3.0, "A"), (5.0, "A")], ONE, {"A": 4.0, "B": 1, "C": 1})
    assert sim.cold == 2 and sim.loads == 1 and sim.waits == [4.0, 1.0]


def test_azure_minute_format_spreads_each_minute_seeded(tmp_path) -> None:
    p = tmp_path / "inv.csv"
    p.write_text("HashOwner,HashApp,HashFunction,Trigger,480,481,482\n"
                 "o,a,f1,http,2,0,3\n"
                 "o,a,f2,timer,0,1,0\n")
    a = load_azure_minute(p, seed=0)
    b = load_azure_minute(p, seed=0)
    c = load_azure_minute(p, seed=1)
    assert a.models == ["f1", "f2"] and a.requests == 6 and a.span_s == 180.0
    assert np.array_equal(a.times, b.times) and not np.array_equal(a.times, c.times)
    assert np.all(np.diff(a.times) >= 0)
    per = {(int(m), int(t // 60)) for t, m in zip(a.times, a.mids, strict=True)}
    assert per == {(0, 0), (0, 2), (1, 1)}
    p2 = tmp_path / "inv2.csv"
    p2.write_text("HashFunction,HashOwner,HashApp,minute_1,minute_2\nx,x,x,1,1\n")
    assert load_azure_minute(p2).requests == 2


def test_requests_format_and_sizes(tmp_path) -> None:
    p = tmp_path / "req.csv"
    p.write_text("timestamp,model,extra\n2024-01-01T00:00:10Z,b,1\n1704067200,a,2\n1704067205.5,a,3\n")
    tr = load_requests(p)
    assert tr.models == ["b", "a"] and tr.requests == 3
    assert tr.times.tolist() == [0.0, 5.5, 10.0] and tr.mids.tolist() == [1, 1, 0]


def test_simulation_is_deterministic_and_cli_writes_json_and_plot(tmp_path) -> None:
    inv = tmp_path / "inv.csv"
    rng = np.random.default_rng(0)
    rows = ["HashOwner,HashApp,HashFunction," + ",".join(f"minute_{i}" for i in range(1, 61))]
    for k in range(20):
        counts = rng.poisson(0.3 + k % 4, 60)
        rows.append(f"o,a,f{k}," + ",".join(str(int(c)) for c in counts))
    inv.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out.json"
    png = tmp_path / "out.png"
    rc = cli_main(["simulate", str(inv), "--gpus", "2", "--gpu-memory", "6GiB", "--json", str(out),
                   "--plot", str(png)])
    assert rc == 0 and png.stat().st_size > 1000
    res = json.loads(out.read_text())
    assert set(res["policies"]) == set(POLICIES)
    for r in res["policies"].values():
        assert {"requests", "cold_starts", "cold_start_share", "p75_model_cold_start_share", "wait_seconds",
                "loads", "bytes_loaded", "memory_gib_hours", "oracle_ratio"} <= set(r)
        assert set(r["wait_seconds"]) == {"p50", "p95", "p99"} and set(r["memory_gib_hours"]) == {"idle", "total"}
        assert all(np.isfinite(v) for v in r["wait_seconds"].values())
    tr = load_azure_minute(inv)
    again = simulate(tr, None, list(POLICIES), 2, 6 * GIB)
    for name, r in res["policies"].items():
        assert again["policies"][name]["cold_starts"] == r["cold_starts"]
        assert again["policies"][name]["bytes_loaded"] == r["bytes_loaded"]
    with pytest.raises(SystemExit):  # refused as the command line is read
        cli_main(["simulate", str(inv), "--policies", "nope"])


TRACE = "HashOwner,HashApp,HashFunction,1,2\no,a,f,1,0\no,a,g,0,2\n"
PROFILE = "model,size_bytes,load_seconds\nf,1e9,2\ng,2e9,3\n"


@pytest.mark.parametrize(("trace_text", "profile_text", "says"), [
    ("HashOwner,HashApp,HashFunction,1,2\no,a,f,1,x\n", PROFILE, "function 'f', minute 2: 'x' is not a request count"),
    ("HashOwner,HashApp,HashFunction,1,2\no,a,f,1\n", PROFILE, "line 2: 4 fields where the header has 5"),
    (TRACE, "model,size\nf,1\n", "missing column(s) size_bytes, load_seconds"),
    (TRACE, "model,size_bytes,load_seconds\nf,1e9,2\ng,12GB,3\n", "line 3: model 'g': size_bytes '12GB' is not a number"),
    (TRACE, "model,size_bytes,load_seconds\nf,1e9,-2\n", "line 2: model 'f': load_seconds '-2' is not a number"),
    (TRACE, "model,size_bytes,load_seconds,base,max_adapters\nf,1e9,2,,\ng,1e7,1,f,x\n",
     "line 3: model 'g': max_adapters 'x' is not a whole number"),
    (TRACE, "model,size_bytes,load_seconds,priority\nf,1e9,2,urgent\n", "line 2: model 'f': priority 'urgent'"),
    (TRACE, "model,size_bytes,load_seconds\nf,0,2\n", "line 2: model 'f': size_bytes '0' is not a size from 1 byte"),
    (TRACE, "model,size_bytes,load_seconds\nf,1e30,2\n", "line 2: model 'f': size_bytes '1e30' is not a size from"),
    (TRACE, "model,size_bytes,load_seconds\nf,1e9,2\ng,2e9,3\nf,3e9,4\n", "line 4: model 'f' is also on line 2"),
    (TRACE, "model,size_bytes,load_seconds\n,1e9,2\n", "line 2: a row needs a model"),
    (TRACE, None, "No such file or directory"),
    ("timestamp,model\n1.0,f\nnotatime,g\n", PROFILE, "line 3: timestamp 'notatime' is neither seconds nor an ISO"),
])
def test_simulate_refuses_a_malformed_trace_or_profile_saying_where(tmp_path, capsys, trace_text: str,
                                                                   profile_text: str | None, says: str) -> None:
    """Bad input is refused with what to fix (the file, the line or cell, the value), not a traceback."""
    inv, prof = tmp_path / "inv.csv", tmp_path / "profile.csv"
    inv.write_text(trace_text)
    if profile_text is not None:
        prof.write_text(profile_text)
    fmt = "requests" if trace_text.startswith("timestamp") else "azure-minute"
    assert cli_main(["simulate", str(inv), "--format", fmt, "--profile", str(prof), "--gpus", "1",
                     "--policies", "on-demand-lru"]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    # the same files, well formed, run
    inv.write_text(TRACE)
    prof.write_text(PROFILE)
    assert cli_main(["simulate", str(inv), "--profile", str(prof), "--gpus", "1", "--policies", "on-demand-lru"]) == 0


# ---- host-memory staging tier (issue 4) --------------------------------------------------------

class Scripted(_Base):
    """A test policy that drives the real engine's host tier: at each scripted time it stages or
    unstages (model, node) and records what the engine answered; a miss loads on GPU `gpu_of[m]`."""

    name = "scripted"

    def __init__(self, script: list[tuple[float, str, str, int]], gpu_of: dict[str, int] | None = None) -> None:
        self.script = script
        self.gpu_of = gpu_of or {}
        self.answers: dict[int, object] = {}
        self.staged_at: dict[str, float] = {}

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        for i, (t, *_rest) in enumerate(self.script):
            sim.timer(t, ("script", i))

    def on_timer(self, t: float, payload: tuple) -> None:
        _tag, i = payload
        _t, op, model, ni = self.script[i]
        m = self.sim.trace.models.index(model)
        self.answers[i] = self.sim.start_stage(m, ni) if op == "stage" else self.sim.unstage(m, ni)

    def on_staged(self, t: float, c: HostCopy) -> None:
        self.staged_at[self.sim.trace.models[c.model]] = t

    def on_miss(self, t: float, m: int) -> None:
        self.sim.start_load(m, self.gpu_of.get(self.sim.trace.models[m], 0), "demand")


def staged_run(events: list[tuple[float, str]], sizes_gib: dict[str, float], load_s: dict[str, float],
               script: list[tuple[float, str, str, int]], host_gib: float = 64.0, gpus: int = 1,
               contention: str = "shared", span: float = 100.0, gpu_of: dict[str, int] | None = None,
               gpu_gib: float = 80.0) -> tuple[Simulation, Scripted]:
    tr = trace(events, span)
    for _t, _op, model, _ni in script:  # scripted models need not be requested
        if model not in tr.models:
            tr.models.append(model)
    sizes = np.array([int(sizes_gib[m] * GIB) for m in tr.models], dtype=np.int64)
    loads = np.array([load_s[m] for m in tr.models], dtype=float)
    sim = Simulation(tr, sizes, loads, gpus, int(gpu_gib * GIB), contention, host_bytes=int(host_gib * GIB))
    pol = Scripted(script, gpu_of)
    sim.run(pol)
    return sim, pol


def test_a_staged_models_load_takes_its_promotion_time() -> None:
    # A: 8 GiB, 10 s from storage; C, D: 1 GiB. All three staged at 0 on node 0 (2 GiB/s shared:
    # alone 4 s, 0.5 s, 0.5 s; at 1/3 speed C and D are done at 1.5 s, A then has 3.5 s left → 5 s).
    # Promotion time (default) = 0.5 + 8/16 + 0.1·8 = 1.8 s: A@10 is cold, promoted, waits 1.8 s.
    # B (never staged) loads from storage: 10 s. C (1 s load) promotes in 0.5 + 1/16 + 0.1 =
    # 0.6625 s; D's load time 0.5 s is below that, so its promotion time is capped at 0.5 s.
    sizes = {"A": 8.0, "B": 8.0, "C": 1.0, "D": 1.0}
    loads = {"A": 10.0, "B": 10.0, "C": 1.0, "D": 0.5}
    script = [(0.0, "stage", "A", 0), (0.0, "stage", "C", 0), (0.0, "stage", "D", 0)]
    events = [(10.0, "A"), (20.0, "B"), (30.0, "C"), (40.0, "D")]
    sim, pol = staged_run(events, sizes, loads, script)
    assert pol.staged_at == pytest.approx({"A": 5.0, "C": 1.5, "D": 1.5})
    assert sim.waits == pytest.approx([1.8, 10.0, 0.6625, 0.5])
    res = sim.results()
    assert res["stages"] == 3 and res["bytes_staged"] == 10 * GIB and res["promotions"] == 3
    assert res["loads"] == 4 and res["unstages"] == 0
    # host memory-time: 10 GiB held from 0 to the end of the trace (100 s)
    assert res["host_memory_gib_hours"] == pytest.approx(10 * 100 / 3600)


def test_a_promotion_shares_its_gpus_link_with_other_loads() -> None:
    # A staged (promotion 1.8 s, as above) and B from storage (4 s) start together on GPU 0:
    # both at half speed until A is done at 3.6 s (B has 4 − 1.8 = 2.2 s left) → B ready at 5.8 s.
    sizes = {"A": 8.0, "B": 1.0}
    loads = {"A": 10.0, "B": 4.0}
    sim, _ = staged_run([(10.0, "A"), (10.0, "B")], sizes, loads, [(0.0, "stage", "A", 0)])
    assert sim.waits == pytest.approx([3.6, 5.8])


def test_stages_on_one_node_share_its_storage_bandwidth() -> None:
    # A 2 GiB (1 s alone at 2 GiB/s) and B 6 GiB (3 s alone) staged at 0 on one node: at half
    # speed A is done at 2 s; B then has 3 − 1 = 2 s left alone → staged at 4 s.
    sizes = {"A": 2.0, "B": 6.0}
    loads = {"A": 5.0, "B": 5.0}
    script = [(0.0, "stage", "A", 0), (0.0, "stage", "B", 0)]
    _, pol = staged_run([(50.0, "A")], sizes, loads, script)
    assert pol.staged_at == pytest.approx({"A": 2.0, "B": 4.0})
    # contention none: each at full speed
    _, pol = staged_run([(50.0, "A")], sizes, loads, script, contention="none")
    assert pol.staged_at == pytest.approx({"A": 1.0, "B": 3.0})
    # on two nodes (16 GPUs, eight a node) they do not slow each other
    _, pol = staged_run([(50.0, "A")], sizes, loads, [(0.0, "stage", "A", 0), (0.0, "stage", "B", 1)], gpus=16)
    assert pol.staged_at == pytest.approx({"A": 1.0, "B": 3.0})


def test_a_stage_only_promotes_on_its_own_node() -> None:
    # A staged on node 0; its miss loads on GPU 8 (node 1): read from storage, 10 s.
    sim, _ = staged_run([(10.0, "A")], {"A": 8.0}, {"A": 10.0}, [(0.0, "stage", "A", 0)], gpus=16,
                        gpu_of={"A": 8})
    assert sim.waits == pytest.approx([10.0]) and sim.promotions == 0


def test_unstage_frees_host_bytes_and_a_stage_that_does_not_fit_is_refused() -> None:
    # 8 GiB host cache. A (6 GiB, staged at 3 s) at 0; unstaging A at 1 s (still staging) is
    # refused; B (4 GiB) at 5 s does not fit (2 GiB free) → refused; staging A again → refused
    # (already held); A unstaged at 10 s (instant); B at 11 s fits.
    sizes = {"A": 6.0, "B": 4.0}
    loads = {"A": 5.0, "B": 5.0}
    script = [(0.0, "stage", "A", 0), (1.0, "unstage", "A", 0), (5.0, "stage", "B", 0),
              (6.0, "stage", "A", 0), (10.0, "unstage", "A", 0), (11.0, "stage", "B", 0)]
    sim, pol = staged_run([(50.0, "B")], sizes, loads, script, host_gib=8.0)
    a = pol.answers
    assert a[0] is not None and a[1] is False and a[2] is None and a[3] is None
    assert a[4] is True and a[5] is not None
    assert sim.host_free(0) == 4 * GIB  # B holds 4 of 8 GiB
    res = sim.results()
    assert res["stages"] == 2 and res["unstages"] == 1 and res["bytes_staged"] == 10 * GIB
    assert res["promotions"] == 1 and sim.waits == pytest.approx([min(5.0, 0.5 + 4 / 16 + 0.4)])
    # host memory-time: A 6 GiB × 10 s + B 4 GiB × (100 − 11) s
    assert res["host_memory_gib_hours"] == pytest.approx((6 * 10 + 4 * 89) / 3600)


def test_unstage_is_refused_while_a_promotion_reads_the_copy() -> None:
    # A staged at 4 s; A@10 promotes (1.8 s, ready 11.8); unstage at 11 → refused, at 12 → done.
    script = [(0.0, "stage", "A", 0), (11.0, "unstage", "A", 0), (12.0, "unstage", "A", 0)]
    _, pol = staged_run([(10.0, "A")], {"A": 8.0}, {"A": 10.0}, script)
    assert pol.answers[1] is False and pol.answers[2] is True


def _random_events(seed: int, n: int = 300, models: int = 10) -> tuple[list[tuple[float, str]], dict, dict]:
    rng = np.random.default_rng(seed)
    events = [(float(t), f"m{int(m)}") for t, m in zip(np.sort(rng.uniform(0, 1800, n)),
                                                         rng.integers(0, models, n), strict=True)]
    sizes = {f"m{i}": 0.5 + (i % 4) * 0.5 for i in range(models)}
    loads = {f"m{i}": 2.0 + i % 3 for i in range(models)}
    return events, sizes, loads


def test_host_tier_off_changes_nothing_and_baselines_ignore_it() -> None:
    events, sizes, loads = _random_events(5)
    tr = trace(events)
    sz = np.array([int(sizes[m] * GIB) for m in tr.models], dtype=np.int64)
    ld = np.array([loads[m] for m in tr.models], dtype=float)
    new_keys = {"stages", "bytes_staged", "unstages", "promotions", "host_memory_gib_hours"}
    for name, cls in POLICIES.items():
        plain = Simulation(tr, sz, ld, 2, 3 * GIB, "shared")
        plain.run(cls())
        off = Simulation(tr, sz, ld, 2, 3 * GIB, "shared", host_bytes=0, stage_bandwidth=1 * GIB,
                         promote_bandwidth=64 * GIB)
        off.run(cls())
        a, b = plain.results(), off.results()
        assert a == b, name
        assert all(b[k] == 0 for k in new_keys), name
        assert plain.waits == off.waits and plain.loads == off.loads, name
        if name == "prewarm":
            continue
        on = Simulation(tr, sz, ld, 2, 3 * GIB, "shared", host_bytes=64 * GIB)
        on.run(cls())
        assert on.results() == a, name  # baselines never stage: same figures with the tier on


def test_prewarm_adapter_reports_and_executes_the_host_tier() -> None:
    from prewarm.domain.policy import NodeState, StagedState

    events = [(float(t), "A") for t in range(0, 300, 10)] + [(5.0, "B")]
    tr = trace(events, 400.0)
    sizes = np.array([2 * GIB, 4 * GIB], dtype=np.int64)  # A, B
    sim = Simulation(tr, sizes, np.array([3.0, 6.0]), 2, 8 * GIB, "shared", host_bytes=8 * GIB)
    pol = POLICIES["prewarm"]()
    sim.run(pol)  # today's planner may or may not stage; it must serve every request either way
    assert all(np.isfinite(sim.waits))
    snap = pol._snapshot()
    assert snap.models["A"].promote_seconds == pytest.approx(min(3.0, 0.5 + 2 / 16 + 0.2))
    for n in list(sim.nodes[0].cached):  # start from an empty host cache
        assert sim.unstage(n, 0)
    snap = pol._snapshot()
    assert snap.nodes == (NodeState("node-0", 8 * GIB, 8 * GIB),) and snap.staged == ()
    t = sim.now
    pol._apply([Stage("B", "node-0", "likely", "test", bytes=4 * GIB),
                Stage("B", "node-0", "likely", "again: ignored"),
                Stage("A", "node-0", "likely", "test"),
                Stage("A", "node-0", "likely", "again: ignored")], t)
    snap = pol._snapshot()
    assert snap.nodes == (NodeState("node-0", 8 * GIB, 2 * GIB),)
    assert snap.staged == (StagedState("B", "node-0", "staging", 4 * GIB, t),
                           StagedState("A", "node-0", "staging", 2 * GIB, t))
    assert pol._snapshot().staged is snap.staged  # cached while nothing changes
    pol._apply([Unstage("B", "node-0", "quiet", "still staging: refused")], t)
    assert sim.nodes[0].used == 6 * GIB
    # let both stages finish: sharing the node, A (1 s alone) is done at t + 2, B at t + 3
    while sim.events and sim.events[0][0] <= t + 10.0:
        sim._dispatch(heapq.heappop(sim.events), math.inf)
    assert sim.nodes[0].cached[1].ready_at == pytest.approx(t + 3.0)
    snap = pol._snapshot()
    assert {s.state for s in snap.staged} == {"staged"}
    pol._apply([Unstage("B", "node-0", "quiet", "test")], sim.now)
    assert pol._snapshot().nodes == (NodeState("node-0", 8 * GIB, 6 * GIB),)
    assert [s.model for s in pol._snapshot().staged] == ["A"]


def test_cli_host_tier_flags_go_into_the_fleet_and_the_table(tmp_path, capsys) -> None:
    p = tmp_path / "req.csv"
    p.write_text("timestamp,model\n" + "".join(f"{t},m{t % 3}\n" for t in range(0, 120, 5)))
    out = tmp_path / "out.json"
    rc = cli_main(["simulate", str(p), "--format", "requests", "--gpus", "1", "--gpu-memory", "4GiB",
                   "--policies", "on-demand-lru,prewarm", "--host-memory", "16GiB",
                   "--stage-bandwidth", "4GiB/s", "--promote-bandwidth", "32GiB", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["fleet"]["host_bytes"] == 16 * GIB
    assert res["fleet"]["stage_bandwidth"] == 4 * GIB and res["fleet"]["promote_bandwidth"] == 32 * GIB
    assert res["policies"]["on-demand-lru"]["stages"] == 0
    assert "promotions" in capsys.readouterr().out
    cli_main(["simulate", str(p), "--format", "requests", "--policies", "on-demand-lru"])
    assert "promotions" not in capsys.readouterr().out


def test_a_replay_tunes_the_collector_and_leaves_it_as_it_was() -> None:
    """simulate() runs each replay with rarer young-generation passes and what existed before frozen out of
    them (prewarm.heap.replay_gc); afterwards the interpreter's settings are back, nothing left frozen."""
    import gc

    from prewarm.heap import YOUNG_PASS_ALLOCATIONS, replay_gc

    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with replay_gc():
        assert gc.get_threshold() == (YOUNG_PASS_ALLOCATIONS, *before[1:])
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), replay_gc():
        raise RuntimeError("a replay that fails")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


@pytest.mark.parametrize("name", ["on-demand-lru", "faascache", "seed-pool"])
def test_a_stalled_round_skips_only_misses_that_cannot_be_placed(name: str) -> None:
    """Rule.monotone_misses: in one on_stalled round a model no larger than one that found no room is not
    tried. On saturated fleets (random traffic, loads far longer than the gaps) the rule then places the same
    loads, evicts the same replicas and serves every request as it does trying each, with fewer misses tried."""
    rng = np.random.default_rng(7)
    names = [f"m{i}" for i in range(12)]
    events = sorted((float(t), names[int(i)]) for t, i in zip(rng.uniform(0, 600, 400), rng.integers(0, 12, 400),
                                                              strict=True))
    sizes = {m: float(s) for m, s in zip(names, rng.uniform(0.5, 3.0, 12), strict=True)}
    loads = {m: float(x) for m, x in zip(names, rng.uniform(20, 90, 12), strict=True)}
    rule = type(POLICIES[name]())
    tries: dict[bool, int] = {}
    sims = {}
    for monotone in (True, False):
        class Counted(rule):  # type: ignore[valid-type, misc]
            monotone_misses = monotone

            def on_miss(self, t: float, m: int) -> None:
                tries[self.monotone_misses] = tries.get(self.monotone_misses, 0) + 1
                super().on_miss(t, m)

        tr = trace(events)
        sim = Simulation(tr, np.array([int(sizes[m] * GIB) for m in tr.models], dtype=np.int64),
                         np.array([loads[m] for m in tr.models]), 2, 4 * GIB, "shared")
        sim.run(Counted())
        sims[monotone] = sim
    a, b = sims[True], sims[False]
    assert (a.cold, a.loads, a.evictions, a.waits) == (b.cold, b.loads, b.evictions, b.waits)
    assert tries[True] < tries[False]  # the fleet was saturated: rounds had misses that could not be placed


@pytest.mark.parametrize("name", ["on-demand-lru", "keepalive-10m", "faascache", "seed-pool"])
def test_victim_heaps_choose_the_victims_a_full_sort_chooses(name: str) -> None:
    """Rule.monotone_keys: the fleet finds victims in per-GPU lazy heaps (placement.VictimHeaps) instead of
    keying and sorting every resident at each miss. On a saturated fleet of many small models (random
    traffic, Zipf-like popularity) the rule evicts the same replicas in the same order and serves every
    request as with the full sort."""
    rng = np.random.default_rng(11)
    n = 60
    names = [f"m{i}" for i in range(n)]
    pick = rng.zipf(1.3, 3000) % n
    events = sorted((float(t), names[int(i)]) for t, i in zip(rng.uniform(0, 7200, 3000), pick, strict=True))
    sizes = {m: float(s) for m, s in zip(names, rng.uniform(0.2, 1.5, n), strict=True)}
    loads = {m: float(x) for m, x in zip(names, rng.uniform(2, 30, n), strict=True)}
    rule = type(POLICIES[name]())
    sims = {}
    order: dict[bool, list[tuple[float, int, int]]] = {True: [], False: []}
    for heaps in (True, False):
        class Keyed(rule):  # type: ignore[valid-type, misc]
            monotone_keys = heaps

        tr = trace(events)
        sim = Simulation(tr, np.array([int(sizes[m] * GIB) for m in tr.models], dtype=np.int64),
                         np.array([loads[m] for m in tr.models]), 3, 6 * GIB, "shared")
        evict = sim.evict

        def logged(m: int, gi: int, sim: Simulation = sim, evict=evict, log=order[heaps]) -> bool:
            done = evict(m, gi)
            if done:
                log.append((sim.now, m, gi))
            return done

        sim.evict = logged  # type: ignore[method-assign]
        sim.run(Keyed())
        assert (sim.heaps is not None) == heaps
        sims[heaps] = sim
    a, b = sims[True], sims[False]
    assert len(order[True]) > 200  # saturated: the victims' order was exercised
    assert order[True] == order[False]
    assert (a.cold, a.loads, a.evictions, a.waits) == (b.cold, b.loads, b.evictions, b.waits)
