"""The slot engine (issue 12): every policy's loads go through per-GPU load slots, a queued load
reserves its memory and waits FIFO; the route hook's GPU choice; the forecasting baseline; the sweep.
Every figure is worked out by hand in the comments."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from prewarm.domain.policy import PolicyConfig
from simulator.cli import main as cli_main
from simulator.engine import Simulation
from simulator.forecast import Forecast, fit_ses, fit_ses_grid
from simulator.policies import POLICIES
from simulator.sweep import main as sweep_main
from simulator.sweep import markdown
from simulator.trace import GIB

from .test_sim import trace


def sim_of(events, sizes_gib, load_s, gpus=1, gpu_gib=4.0, contention="shared", span=None, slots=2):
    tr = trace(events, span)
    sizes = np.array([int(sizes_gib[m] * GIB) for m in tr.models], dtype=np.int64)
    loads = np.array([load_s[m] for m in tr.models], dtype=float)
    return Simulation(tr, sizes, loads, gpus, int(gpu_gib * GIB), contention, load_slots=slots)


THREE = [(0.0, "A"), (1.0, "B"), (2.0, "C")]
SIZES = {"A": 1.0, "B": 1.0, "C": 1.0, "D": 1.0}
TEN = {"A": 10.0, "B": 10.0, "C": 10.0, "D": 10.0}


def test_two_slots_queue_the_third_load_fifo_with_its_memory_reserved() -> None:
    # One GPU, 2 slots, shared link. A@0 alone for 1 s (9 s left); B@1: A and B at half speed;
    # C@2 finds both slots busy: queued, its 1 GiB reserved at once. A finishes at 1 + 2·9 = 19
    # (wait 19); B has 10 − 9 = 1 s left, C takes the free slot at 19: both at half speed, B done
    # at 21 (wait 20); C has 9 s left, alone: done at 30 (wait 28).
    sim = sim_of(THREE, SIZES, TEN)
    seen = {}

    class Watch(POLICIES["on-demand-lru"]):  # type: ignore[misc, valid-type]
        def on_miss(self, t, m):  # C's state right after its load was sent
            super().on_miss(t, m)
            if m == 2:
                g = self.fleet.gpus[0]
                seen["state"] = self.fleet.replicas[2][0].state
                seen["used"] = g.used
                seen["queue"] = [r.model for r in g.queue]

    sim.run(Watch())
    assert sim.waits == pytest.approx([19.0, 20.0, 28.0])
    assert seen == {"state": "pending", "used": 3 * GIB, "queue": [2]}
    assert sim.queued_loads == 1 and sim.loads == 3
    assert sim.results()["queued_loads"] == 1


def test_without_slots_the_same_loads_share_the_link_processor_style() -> None:
    # load_slots=0 (the old model): A alone 1 s (9 left); A, B at 1/2 for 1 s (8.5, 9.5 left);
    # from 2 all three at 1/3: A done after 3·8.5 = 25.5 → 27.5 (wait 27.5); B (1 left) and C
    # (1.5 left) at 1/2: B done at 29.5 (wait 28.5); C (0.5 left) alone: done at 30 (wait 28).
    sim = sim_of(THREE, SIZES, TEN, slots=0)
    sim.run(POLICIES["on-demand-lru"]())
    assert sim.waits == pytest.approx([27.5, 28.5, 28.0])
    assert sim.queued_loads == 0


def test_slots_without_contention_run_each_load_at_full_speed_and_queue_the_rest() -> None:
    # contention "none", 1 slot: A 0 → 10, B queued, starts at 10 → 20 (wait 19), C 20 → 30 (wait 28).
    sim = sim_of(THREE, SIZES, TEN, contention="none", slots=1)
    sim.run(POLICIES["on-demand-lru"]())
    assert sim.waits == pytest.approx([10.0, 19.0, 28.0])


def test_a_queued_load_is_not_evictable_and_is_held_in_memory_time() -> None:
    # 1 slot, 2 GiB: A@0 loads 0 → 10; B@1 queued (memory from 1), loads 10 → 20. C@2: no room and
    # no ready replica to evict (A loading, B pending): C waits, stalled, until A is ready at 10,
    # then evicts A (the one ready replica: B is queued) and queues behind B:
    # loads 20 → 30, wait 28. Memory-time: A 0 → 10, B 1 → 30 (span end), C 10 → 30 → 59 GiB·s.
    sim = sim_of(THREE, SIZES, TEN, gpu_gib=2.0, contention="none", slots=1, span=30.0)
    sim.run(POLICIES["on-demand-lru"]())
    assert sim.waits == pytest.approx([10.0, 19.0, 28.0])
    assert sim.evictions == 1 and sim.last_evicted[0] == pytest.approx(10.0)
    assert sim.mem_total == pytest.approx(59.0 * GIB)


def test_on_demand_loads_pick_a_gpu_as_the_one_placement_rule_ranks_them() -> None:
    # Two 4 GiB GPUs, 1 slot each, no contention, 10 s loads; a baseline's load on a GPU with room goes where
    # rank() says (a free slot, then the fewest loads, then the tightest fit). A (2 GiB) @0: a tie → GPU 0,
    # ready at 10. B (1 GiB) @20: both idle, GPU 0 leaves 1 GiB over against 3 → GPU 0, loading 20 → 30.
    # C@21: GPU 0's slot is busy, GPU 1's free → GPU 1, 21 → 31. D@22: both slots busy, one load each →
    # the tightest fit, GPU 0 (1 GiB free, exactly D): queued behind B, loads 30 → 40, wait 18.
    sizes = {"A": 2.0, "B": 1.0, "C": 1.0, "D": 1.0}
    events = [(0.0, "A"), (20.0, "B"), (21.0, "C"), (22.0, "D")]
    sim = sim_of(events, sizes, TEN, gpus=2, contention="none", slots=1)
    sim.run(POLICIES["on-demand-lru"]())
    placed = {sim.trace.models[m]: list(sim.replicas[m]) for m in range(4)}
    assert placed == {"A": [0], "B": [0], "C": [1], "D": [0]}
    assert sim.waits == pytest.approx([10.0, 10.0, 10.0, 18.0])
    unslotted = sim_of(events, sizes, TEN, gpus=2, contention="none", slots=0)
    unslotted.run(POLICIES["on-demand-lru"]())
    # without slots every load starts at once; C still avoids the GPU whose link B is loading on
    assert list(unslotted.replicas[2]) == [1] and unslotted.waits == pytest.approx([10.0] * 4)


def test_prewarm_reports_a_queued_load_as_pending() -> None:
    # prewarm's plan sends no GPU more loads than its slots: with slots = its limit (2) nothing
    # queues, and with 1 slot a second load it sends does, and it sees that load as `pending`. (Links shared, as
    # before the link wait: with it, B waits in the plan for A's link instead of in the slot queue.)
    shared = PolicyConfig(link_wait=False)
    events = [(0.0, "A"), (0.5, "B")]
    sim = sim_of(events, {"A": 1.0, "B": 1.0}, {"A": 10.0, "B": 10.0}, slots=2)
    sim.run(POLICIES["prewarm"](shared))
    assert sim.queued_loads == 0 and sim.cold == 2
    sim = sim_of(events, {"A": 1.0, "B": 1.0}, {"A": 10.0, "B": 10.0}, slots=1)
    pol = POLICIES["prewarm"](shared)
    sim.run(pol)
    assert sim.queued_loads == 1
    sim = sim_of(events, {"A": 1.0, "B": 1.0}, {"A": 10.0, "B": 10.0}, slots=1)
    sim.run(POLICIES["prewarm"]())
    assert sim.queued_loads == 0 and sim.cold == 2  # the link wait: B's load starts when A's ends
    sim2 = sim_of(events, {"A": 1.0, "B": 1.0}, {"A": 10.0, "B": 10.0}, slots=1)
    pol2 = POLICIES["prewarm"]()
    pol2.attach(sim2)
    sim2.policy = pol2
    sim2.now = 0.0
    sim2.start_load(0, 0, "demand")
    sim2.start_load(1, 0, "demand")
    pol2.dirty.update({(0, 0), (1, 0)})
    states = {r.model: r.state for r in pol2._snapshot().replicas}
    assert states == {"A": "loading", "B": "pending"}


def test_bad_load_slots_are_refused_with_a_clear_message(tmp_path, capsys) -> None:
    with pytest.raises(ValueError, match="load_slots"):
        sim_of(THREE, SIZES, TEN, slots=-1)
    csv = tmp_path / "r.csv"
    csv.write_text("timestamp,model\n0,A\n5,B\n")
    assert cli_main(["simulate", str(csv), "--format", "requests", "--load-slots", "-1"]) == 2
    assert "--load-slots" in capsys.readouterr().err


def test_cli_load_slots_go_into_the_fleet(tmp_path) -> None:
    csv = tmp_path / "r.csv"
    csv.write_text("timestamp,model\n0,A\n1,B\n2,C\n")
    out = tmp_path / "o.json"
    assert cli_main(["simulate", str(csv), "--format", "requests", "--policies", "on-demand-lru",
                     "--gpus", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["fleet"]["load_slots"] == 2
    assert cli_main(["simulate", str(csv), "--format", "requests", "--policies", "on-demand-lru",
                     "--gpus", "1", "--load-slots", "0", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["fleet"]["load_slots"] == 0


# ---- forecast ----------------------------------------------------------------------------------

def test_ses_grid_fit_matches_statsmodels() -> None:
    rng = np.random.default_rng(0)
    walk = np.maximum(0.0, np.cumsum(rng.normal(0, 0.3, 240)) + 5 + rng.normal(0, 0.5, 240))
    flat = rng.poisson(2.0, 240).astype(float)
    alpha, nxt = fit_ses_grid(np.stack([walk, flat], axis=1))
    for i, y in enumerate((walk, flat)):
        a_ref, f_ref = fit_ses(y)
        assert abs(alpha[i] - a_ref) <= 0.02  # the grid's step
        assert nxt[i] == pytest.approx(f_ref, rel=0.02)


def test_ses_grid_by_hand() -> None:
    # y = 0, 4 with α ∈ {0.5, 1}: level 0 → one error 4 either way (equal SSE 16: the first α, 0.5)
    # → forecast 0 + 0.5·4 = 2. y = 0, 4, 4: α 0.5 errors 4, 2 (SSE 20), α 1: 4, 0 (SSE 16) → α 1,
    # forecast 4.
    a, f = fit_ses_grid(np.array([[0.0], [4.0]]), np.array([0.5, 1.0]))
    assert a.tolist() == [0.5] and f.tolist() == [2.0]
    a, f = fit_ses_grid(np.array([[0.0], [4.0], [4.0]]), np.array([0.5, 1.0]))
    assert a.tolist() == [1.0] and f.tolist() == [4.0]


def test_forecast_preloads_a_model_whose_forecast_stays_hot() -> None:
    # 1 GiB GPU, A and B 1 GiB, 1 s loads, threshold 0.5. A every 10 s from 0 to 300; B once at 305.
    # Per-minute counts of A: 6 in each minute up to 300, 1 in [300, 360). Level (α 0.5, no refit
    # before 900 s): 3, 4.5, 5.25, 5.625, 5.8125 at ticks 60..300, then 3.40625 at 360.
    # B@305 cold evicts A (the only replica); at the 360 tick A's P = 1 − exp(−3.40625/60 · 61)
    # = 0.97 ≥ 0.5 and B's (level 0.5) = 1 − exp(−0.5/60 · 61) = 0.40 < 0.5: A is pre-loaded,
    # evicting B, ready at 361 → A@365 warm. 2 cold starts (A@0, B@305), 3 loads.
    # LRU: A@365 is cold too (3 cold starts).
    events = [(10.0 * k, "A") for k in range(31)] + [(305.0, "B"), (365.0, "A")]
    one = {"A": 1.0, "B": 1.0}
    fast = {"A": 1.0, "B": 1.0}
    sim = sim_of(events, one, fast, gpu_gib=1.0, contention="none", span=400.0)
    pol = Forecast()
    pol.threshold = 0.5
    sim.run(pol)
    assert pol.level[0] == pytest.approx(3.40625) and pol.level[1] == pytest.approx(0.5)
    assert pol.p[0] == pytest.approx(-math.expm1(-3.40625 / 60 * 61))
    assert sim.cold == 2 and sim.loads == 3 and sim.evictions == 2
    assert sim.replicas[0][0].kind == "forecast"
    lru = sim_of(events, one, fast, gpu_gib=1.0, contention="none", span=400.0)
    lru.run(POLICIES["on-demand-lru"]())
    assert lru.cold == 3


def test_forecast_evicts_below_threshold_replicas_first_then_lru() -> None:
    # 2 GiB, three 1 GiB models, 1 s loads, threshold 0.5. A every 10 s from 0 to 170: level 3, 4.5,
    # 5.25 at the 60, 120, 180 ticks → P ≈ 1, hot. B once at 185 (ready 186); no tick since, so its
    # level is 0 → P 0, below. C@190 needs room: LRU would evict A (last request 170 < B's 186);
    # forecast evicts B, the replica below the threshold.
    events = [(10.0 * k, "A") for k in range(18)] + [(185.0, "B"), (190.0, "C")]
    sizes = {"A": 1.0, "B": 1.0, "C": 1.0}
    loads = {"A": 1.0, "B": 1.0, "C": 1.0}
    sim = sim_of(events, sizes, loads, gpu_gib=2.0, contention="none", span=200.0)
    pol = Forecast()
    pol.threshold = 0.5
    sim.run(pol)
    assert sim.last_evicted == {1: pytest.approx(190.0)}
    assert sorted(sim.gpus[0].residents) == [0, 2]
    lru = sim_of(events, sizes, loads, gpu_gib=2.0, contention="none", span=200.0)
    lru.run(POLICIES["on-demand-lru"]())
    assert list(lru.last_evicted) == [0]


def test_forecast_is_part_of_all_policies() -> None:
    assert "forecast" in POLICIES


# ---- sweep -------------------------------------------------------------------------------------

def test_sweep_writes_the_table_json_and_plot(tmp_path) -> None:
    # a tiny sample in the sweep's layout: <traces>/<sample>/invocations.csv + profile.csv
    d = tmp_path / "traces" / "tiny"
    d.mkdir(parents=True)
    rng = np.random.default_rng(1)
    counts = rng.poisson(0.6, (6, 30))
    rows = ["HashOwner,HashApp,HashFunction," + ",".join(str(i + 1) for i in range(30))]
    rows += [f"o,a,f{i}," + ",".join(str(int(c)) for c in counts[i]) for i in range(6)]
    (d / "invocations.csv").write_text("\n".join(rows) + "\n")
    (d / "profile.csv").write_text("model,size_bytes,load_seconds\n" + "".join(
        f"f{i},{GIB},{3.0 + i}\n" for i in range(6)))
    out = tmp_path / "out"
    assert sweep_main(["--traces", str(tmp_path / "traces"), "--samples", "tiny", "--gpus", "1,2",
                       "--seeds", "0", "--gpu-memory", "2GiB", "--jobs", "2", "--out", str(out)]) == 0
    data = json.loads((out / "sweep.json").read_text())
    assert {(r["gpus"], r["policy"]) for r in data["rows"]} == {(g, p) for g in (1, 2) for p in POLICIES}
    md = (out / "sweep.md").read_text()
    assert md == markdown(data["rows"], 2)
    # the summary, every policy's cold starts, every policy's cold-wait seconds
    assert md.count("| tiny | 1 | 0 |") == 3 and md.count("| tiny | 2 | 0 |") == 3
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def tiny_sample(tmp_path):
    d = tmp_path / "traces" / "tiny"
    d.mkdir(parents=True)
    rng = np.random.default_rng(1)
    counts = rng.poisson(0.6, (6, 30))
    rows = ["HashOwner,HashApp,HashFunction," + ",".join(str(i + 1) for i in range(30))]
    rows += [f"o,a,f{i}," + ",".join(str(int(c)) for c in counts[i]) for i in range(6)]
    (d / "invocations.csv").write_text("\n".join(rows) + "\n")
    (d / "profile.csv").write_text("model,size_bytes,load_seconds\n" + "".join(
        f"f{i},{GIB},{3.0 + i}\n" for i in range(6)))
    return tmp_path / "traces"


def test_sweep_keep_reruns_one_policy_and_keeps_the_other_rows(tmp_path, capsys) -> None:
    """--policies prewarm --keep OLD: prewarm's rows are run again (here with an idle-memory budget),
    every other policy's row comes from OLD unchanged; OLD from another fleet is refused."""
    traces = tiny_sample(tmp_path)
    common = ["--traces", str(traces), "--samples", "tiny", "--gpus", "1", "--seeds", "0", "--gpu-memory", "2GiB"]
    assert sweep_main([*common, "--policies", "faascache,prewarm", "--out", str(tmp_path / "a")]) == 0
    old = json.loads((tmp_path / "a" / "sweep.json").read_text())
    old["rows"] = [dict(r, cold_starts=10**6) if r["policy"] == "faascache" else r for r in old["rows"]]
    (tmp_path / "a" / "sweep.json").write_text(json.dumps(old))  # marked: the kept row must be this one
    assert sweep_main([*common, "--policies", "prewarm", "--idle-memory-budget", "0",
                       "--keep", str(tmp_path / "a" / "sweep.json"), "--out", str(tmp_path / "b")]) == 0
    new = json.loads((tmp_path / "b" / "sweep.json").read_text())
    by = {r["policy"]: r for r in new["rows"]}
    assert sorted(by) == ["faascache", "prewarm"] and by["faascache"]["cold_starts"] == 10**6
    assert new["idle_memory_budget"] == 0.0 and new["kept_from"].endswith("sweep.json")
    assert "faascache 1,000,000" in (tmp_path / "b" / "sweep.md").read_text()
    capsys.readouterr()
    assert sweep_main([*common[:-1], "4GiB", "--policies", "prewarm",
                       "--keep", str(tmp_path / "a" / "sweep.json"), "--out", str(tmp_path / "c")]) == 2
    assert "--gpu-memory" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_sweep_and_simulate_refuse_a_bad_idle_memory_budget(tmp_path, capsys) -> None:
    traces = tiny_sample(tmp_path)
    assert sweep_main(["--traces", str(traces), "--samples", "tiny", "--idle-memory-budget", "2"]) == 2
    assert "--idle-memory-budget='2'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # as the command line is read
        sweep_main(["--traces", str(traces), "--samples", "tiny", "--seeds", "0,-1"])
    assert "argument --seeds: '-1' is not a whole number of at least 0" in capsys.readouterr().err
    assert cli_main(["simulate", str(traces / "tiny" / "invocations.csv"), "--idle-memory-budget", "half"]) == 2
    assert "from 0 to 1" in capsys.readouterr().err


def test_sweep_best_baseline_excludes_prewarm_and_oracle() -> None:
    def row(p, cold):
        return {"sample": "s", "gpus": 8, "seed": 0, "policy": p, "cold_starts": cold, "bytes_loaded": GIB * 1024,
                "memory_gib_hours": {"total": 100.0}}
    md = markdown([row("prewarm", 50), row("oracle", 10), row("faascache", 100), row("forecast", 80)], 2)
    assert "| s | 8 | 0 | 50 | forecast 80 | **0.62** | 10 |" in md


def test_sweep_refuses_missing_traces(tmp_path, capsys) -> None:
    assert sweep_main(["--traces", str(tmp_path), "--samples", "nope"]) == 2
    assert "missing" in capsys.readouterr().err


def test_sweep_refuses_a_malformed_profile_before_any_job(tmp_path, capsys) -> None:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "invocations.csv").write_text("HashOwner,HashApp,HashFunction,1\no,a,f,1\n")
    (d / "profile.csv").write_text("model,size_bytes,load_seconds\nf,big,2\n")
    assert sweep_main(["--traces", str(tmp_path), "--samples", "mine", "--policies", "on-demand-lru",
                       "--out", str(tmp_path / "out")]) == 2
    assert "line 2: model 'f': size_bytes 'big' is not a number" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    # and a malformed trace: refused before the pool starts, not a job's traceback
    (d / "profile.csv").write_text("model,size_bytes,load_seconds\nf,1e9,2\n")
    (d / "invocations.csv").write_text("HashOwner,HashApp,HashFunction,1,2\no,a,f,1,x\n")
    assert sweep_main(["--traces", str(tmp_path), "--samples", "mine", "--policies", "on-demand-lru",
                       "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "function 'f', minute 2: 'x' is not a request count" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_cancelled_load_frees_its_slot_and_bytes_and_its_waiting_requests_are_placed_again() -> None:
    # One GPU, 1 slot. A@0 loads (10 s); B@1 is queued behind it. At B's miss A's load is cancelled (as the
    # worker does on an evict): B takes the slot at 1 and is ready at 11 (wait 10); A's request still waits,
    # so the policy places A again when B's load ends: 11 + 10 = 21 (wait 21). A ready replica is not a load
    # in flight: cancel_load refuses it.
    sim = sim_of([(0.0, "A"), (1.0, "B")], SIZES, TEN, slots=1)
    seen = {}

    class Cancel(POLICIES["on-demand-lru"]):  # type: ignore[misc, valid-type]
        def on_miss(self, t, m):
            super().on_miss(t, m)
            if m == 1:
                seen["queued"] = self.fleet.replicas[1][0].state
                seen["cancelled"] = self.fleet.cancel_load(0, 0)
                seen["used"] = self.fleet.gpus[0].used
                seen["b"] = self.fleet.replicas[1][0].state

    sim.run(Cancel())
    assert seen == {"queued": "pending", "cancelled": True, "used": 1 * GIB, "b": "loading"}
    assert sorted(sim.waits) == pytest.approx([10.0, 21.0])
    assert sim.cancelled_loads == 1 and sim.results()["cancelled_loads"] == 1
    assert sim.loads == 3 and sim.cold == 2
    assert not sim.cancel_load(1, 0)  # B is ready
