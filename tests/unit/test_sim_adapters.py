"""The simulator's adapter view (issue 29, item 5): LoRA adapters served inside their base's replicas, in a
bounded number of slots (LRU, load on a miss: vLLM's mechanics, the same for every policy). Each test works
its figures out by hand in the comments."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from simulator.adapter_profile import adapter_bytes, write_profile
from simulator.adapters import adapter_view, read_adapter_columns
from simulator.cli import main as cli_main
from simulator.engine import Simulation
from simulator.policies import POLICIES
from simulator.trace import GIB, Trace, load_profile, load_profile_fields

from .test_sim import trace


def profile(tmp_path: Path, rows: list[tuple[str, float, float, str, int | str]]) -> Path:
    p = tmp_path / "profile.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "size_bytes", "load_seconds", "base", "max_adapters"])
        for m, gib, load, base, slots in rows:
            w.writerow([m, int(gib * GIB), load, base, slots])
    return p


def sim_of(tmp_path: Path, events: list[tuple[float, str]], slots: int = 2, gpus: int = 1,
           base_load: float = 10.0) -> Simulation:
    """Base B (1 GiB, `base_load` s to start, `slots` LoRA slots), adapters a1..a3 of it (0.5 s loads)."""
    tr = trace(events)
    prof = profile(tmp_path, [("B", 1.0, base_load, "", slots), ("a1", 0.01, 0.5, "B", ""),
                              ("a2", 0.01, 0.5, "B", ""), ("a3", 0.01, 0.5, "B", "")])
    sizes, loads = load_profile(prof, tr.models)
    prio, ages = load_profile_fields(prof, tr.models)
    view = adapter_view(tr, prof, sizes, loads, prio, ages)
    assert view is not None
    tr2, sizes, loads, prio, ages, ad = view
    return Simulation(tr2, sizes, loads, gpus, 2 * GIB, "none", priority=prio, max_replica_age=ages, adapters=ad)


def test_the_bases_view_counts_each_adapter_request_for_its_base(tmp_path) -> None:
    tr = trace([(0, "a1"), (1, "a2"), (2, "a1")])
    prof = profile(tmp_path, [("B", 1.0, 10.0, "", 2), ("a1", 0.01, 0.5, "B", ""), ("a2", 0.01, 0.5, "B", "")])
    sizes, loads = load_profile(prof, tr.models)
    view = adapter_view(tr, prof, sizes, loads, [1, 1], [None, None])
    assert view is not None
    tr2, sizes2, loads2, _p, _a, ad = view
    assert tr2.models == ["a1", "a2", "B"]  # the base, named by no request, joins the models
    assert tr2.mids.tolist() == [2, 2, 2]  # every request is one for the base
    assert ad.amids.tolist() == [0, 1, 0]  # ... and still names its adapter
    assert ad.host == [2, 2, -1] and ad.max_adapters == [0, 0, 2]
    assert sizes2[2] == GIB and loads2[2] == 10.0


def test_a_profile_without_adapters_leaves_the_trace_as_it_is(tmp_path) -> None:
    p = tmp_path / "plain.csv"
    p.write_text("model,size_bytes,load_seconds\nA,100,1.0\n")
    assert read_adapter_columns(p) is None
    tr = trace([(0, "A")])
    assert adapter_view(tr, p, np.array([100]), np.array([1.0]), [1], [None]) is None


def test_lru_in_the_slots_and_load_on_a_miss_by_hand(tmp_path) -> None:
    # 2 slots. a1@0: no base: cold on the engine start (B ready at 10), then a1 loads (ready 10.5): waits 10.5.
    # a1@20 warm. a2@30: a free slot: cold on the adapter only, waits 0.5 (served 30.5).
    # a3@40: slots full (a1 last used 20, a2 30.5): LRU unloads a1, waits 0.5.
    # a1@50: full (a2 30.5, a3 40.5): unloads a2, waits 0.5. One engine start, 4 adapter loads, 2 evictions.
    sim = sim_of(tmp_path, [(0, "a1"), (20, "a1"), (30, "a2"), (40, "a3"), (50, "a1")])
    sim.run(POLICIES["on-demand-lru"]())
    a = sim.results()["adapters"]
    assert (a["engine_starts"], a["cold_engine"], a["cold_adapter"]) == (1, 1, 3)
    assert (a["adapter_loads"], a["adapter_evictions"]) == (4, 2)
    assert sim.cold == 4 and sim.waits == pytest.approx([10.5, 0.5, 0.5, 0.5])
    assert a["adapter_wait_over_load_max"] == pytest.approx(0.0)
    held = {sim.trace.models[m] for m in sim.ad.slots[(3, 0)]}  # base B is model 3 (after a1, a2, a3)
    assert held == {"a3", "a1"}


def test_a_request_for_an_adapter_in_flight_waits_for_that_load_not_a_second(tmp_path) -> None:
    # B ready at 10 (a1@0 waits on it); a2@20 starts a2's load (ready 20.5); a2@20.2 joins it: waits 0.3.
    sim = sim_of(tmp_path, [(0, "a1"), (20, "a2"), (20.2, "a2")])
    sim.run(POLICIES["on-demand-lru"]())
    a = sim.results()["adapters"]
    assert a["adapter_loads"] == 2 and a["cold_adapter"] == 2
    assert sim.waits == pytest.approx([10.5, 0.5, 0.3])


def test_requests_waiting_on_the_base_load_their_adapters_when_it_is_ready(tmp_path) -> None:
    # 1 slot. a1@0 and a2@1 wait on B (ready 10). At 10 a1 loads into the one slot (ready 10.5); a2 finds
    # every slot loading and waits; at 10.5 a1's request is served, then a2 unloads it (LRU), ready 11.0.
    sim = sim_of(tmp_path, [(0, "a1"), (1, "a2")], slots=1)
    sim.run(POLICIES["on-demand-lru"]())
    a = sim.results()["adapters"]
    assert (a["cold_engine"], a["cold_adapter"], a["adapter_loads"], a["adapter_evictions"]) == (2, 0, 2, 1)
    assert sim.waits == pytest.approx([10.5, 10.0])


def test_evicting_a_base_unloads_its_adapters_and_the_next_request_waits_on_the_base(tmp_path) -> None:
    # keepalive-10m: B serves a1 at 10.5 (its load's end), then is idle: evicted at 610.5 with a1 in it.
    # a1@700: cold on the base again (a second engine start), waits 10.5.
    sim = sim_of(tmp_path, [(0, "a1"), (700, "a1")])
    sim.run(POLICIES["keepalive-10m"]())
    a = sim.results()["adapters"]
    assert a["adapters_unloaded_with_base"] == 1
    assert (a["engine_starts"], a["cold_engine"], a["cold_adapter"]) == (2, 2, 0)
    assert a["engine_starts_waited"] == 2  # both starts had a request waiting on them
    assert sim.waits == pytest.approx([10.5, 10.5])


def test_every_policy_runs_the_adapter_view_and_reports_its_split(tmp_path) -> None:
    # two bases' worth of traffic; whatever a policy plans, each request is warm, cold on the base or cold on
    # an adapter, and no adapter-only cold request waits more than its load time plus a tick
    events = [(float(t), f"a{1 + t % 3}") for t in range(0, 300, 7)]
    for name in POLICIES:
        sim = sim_of(tmp_path, events, slots=2)
        sim.run(POLICIES[name]())
        r = sim.results()
        a = r["adapters"]
        assert a["cold_engine"] + a["cold_adapter"] == r["cold_starts"], name
        assert a["cold_engine"] >= 1 or name in ("prewarm",), name  # only a policy that loads ahead avoids it
        assert a["adapter_wait_over_load_max"] <= 2.0 + 1e-9, name
        assert r["unserved"] == 0, name


def test_the_servegen_profile_maps_each_stream_to_its_tiers_base(tmp_path) -> None:
    src = tmp_path / "src.csv"
    src.write_text("model,size_bytes,load_seconds\nm-small.c000,15200000000,9.994\n"
                   "m-large.c000,65000000000,37.822\nm-large.c001,65000000000,37.822\n")
    out = tmp_path / "out.csv"
    assert write_profile(src, out, max_adapters=8) == 3
    rows = {r["model"]: r for r in csv.DictReader(open(out))}
    assert rows["m-large"]["base"] == "" and rows["m-large"]["max_adapters"] == "8"
    assert rows["m-large"]["size_bytes"] == "65000000000" and rows["m-large"]["load_seconds"] == "37.822"
    assert rows["m-large.c001"]["base"] == "m-large"
    small = int(rows["m-small.c000"]["size_bytes"])
    assert small == adapter_bytes(3584, 28, 512)
    assert 10e6 < small < int(rows["m-large.c000"]["size_bytes"]) < 100e6  # tens of MB
    assert 0.2 <= float(rows["m-small.c000"]["load_seconds"]) <= 1.0


def test_cli_prints_the_adapter_split(tmp_path, capsys) -> None:
    src = tmp_path / "inv.csv"
    src.write_text("HashOwner,HashApp,HashFunction,Trigger,1,2,3\no,a,a1,http,2,0,1\no,a,a2,http,0,3,0\n")
    prof = profile(tmp_path, [("B", 1.0, 5.0, "", 1), ("a1", 0.01, 0.5, "B", ""), ("a2", 0.01, 0.5, "B", "")])
    assert cli_main(["simulate", str(src), "--profile", str(prof), "--gpus", "1", "--gpu-memory", "2GiB",
                     "--policies", "on-demand-lru,prewarm"]) == 0
    out = capsys.readouterr().out
    assert "engine st" in out and "cold adp" in out


def test_whole_model_traces_keep_the_engines_own_path(tmp_path) -> None:
    tr = Trace(["A"], np.array([0.0, 5.0]), np.array([0, 0], dtype=np.int32), 5.0, "t", "requests")
    sim = Simulation(tr, np.array([GIB]), np.array([1.0]), 1, 2 * GIB, "none")
    sim.run(POLICIES["on-demand-lru"]())
    assert sim.ad is None and "adapters" not in sim.results() and sim.waits == [1.0]


def test_prewarm_plans_adapters_and_more_slots_where_lru_thrashes(tmp_path) -> None:
    # One slot per replica, a1 and a2 asked in turn every 5 s for 10 minutes, 2 GPUs with room for a second
    # base replica. The shared LRU mechanics alone swap the one slot at nearly every request (every baseline:
    # they hold one replica of B, as of any model); prewarm starts a second replica for the working set and
    # holds both adapters, so only the first requests are cold.
    events = [(float(t), "a1" if t % 10 == 0 else "a2") for t in range(0, 600, 5)]
    lru = sim_of(tmp_path, events, slots=1, gpus=2)
    lru.run(POLICIES["on-demand-lru"]())
    pw = sim_of(tmp_path, events, slots=1, gpus=2)
    pw.run(POLICIES["prewarm"]())
    a_lru, a_pw = lru.results()["adapters"], pw.results()["adapters"]
    assert a_lru["cold_adapter"] > 100
    assert a_pw["engine_starts"] == 2 and a_pw["adapter_loads_ahead"] >= 1
    assert a_pw["engine_starts_waited"] == 1  # the second replica was started ahead: no request waited on it
    assert a_pw["cold_engine"] + a_pw["cold_adapter"] <= 10
    for rep in pw.ad.slots:  # every adapter it held sat in a replica of its own base
        assert rep[0] == pw.trace.models.index("B")


def test_a_profile_read_once_reads_as_its_file(tmp_path) -> None:
    """simulate() reads a profile once (read_profile) for its three readers: each gives what the file's path gives,
    and a bad row is refused in the same words."""
    from simulator.trace import ProfileError, read_profile

    prof = profile(tmp_path, [("B", 1.0, 10.0, "", 2), ("a1", 0.01, 0.5, "B", ""), ("a2", 0.01, 0.5, "B", "")])
    read = read_profile(prof)
    models = ["a1", "a2", "zz"]  # zz: not in the profile, a seeded size
    for a, b in zip(load_profile(read, models), load_profile(prof, models), strict=True):
        assert a.tolist() == b.tolist()
    assert load_profile_fields(read, models) == load_profile_fields(prof, models)
    assert read_adapter_columns(read) == read_adapter_columns(prof)
    tr = trace([(0, "a1"), (1, "a2")])
    a_view, p_view = adapter_view(tr, read, *load_profile(read, tr.models), [1, 1], [None, None]), \
        adapter_view(tr, prof, *load_profile(prof, tr.models), [1, 1], [None, None])
    assert a_view is not None and p_view is not None and a_view[0].models == p_view[0].models
    bad = tmp_path / "bad.csv"
    bad.write_text("model,size_bytes,load_seconds,base,max_adapters\nB,1e9,2,,x\n")
    with pytest.raises(ProfileError, match=f"profile {bad}: line 2: model 'B': max_adapters 'x'"):
        read_adapter_columns(read_profile(bad))
