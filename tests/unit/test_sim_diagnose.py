"""The diagnostic replay (simulator/diagnose.py): each cold start's class on a tiny trace worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

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


# ---- every trace format (issue 26): the reader `simulate` and the sweep use --------------------

SERVEGEN_PROFILE = ("model,size_bytes,load_seconds\n"
                    "m-large.c001,65000000000,37.8\nm-mid.c002,29400000000,17.9\n")


def test_diagnose_reads_a_servegen_requests_slice_by_hand(tmp_path) -> None:
    # ServeGen's per-request layout (servegen-lang-96h: timestamp,model, millisecond seconds), one
    # 80 GiB GPU: m-large (60.5 GiB, 37.8 s) and m-mid (27.4 GiB, 17.9 s) never fit together. LRU:
    # large@0 first/none, its load 0–37.8 s; large@1.5 first/loading; both wait for 37.8 s.
    # mid@100.25 first/none: large is evicted for it (load 100.25–118.15 s, wait 17.9 s).
    # large@200.125 eviction/none (back 99.875 s after its eviction): mid evicted, wait 37.8 s.
    # Waits 37.8 + 36.3 + 17.9 + 37.8 = 129.8 s over 4 cold requests: mean 32.45 s.
    from simulator.diagnose import main

    tr = tmp_path / "requests.csv"
    tr.write_text("timestamp,model\n0.000,m-large.c001\n1.500,m-large.c001\n100.250,m-mid.c002\n"
                  "200.125,m-large.c001\n")
    prof = tmp_path / "profile.csv"
    prof.write_text(SERVEGEN_PROFILE)
    out = tmp_path / "d.json"
    assert main([str(tr), "--format", "requests", "--profile", str(prof), "--gpus", "1",
                 "--policy", "on-demand-lru", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["cold_starts"] == 4
    assert d["classes"] == {"first/none": 2, "first/loading": 1, "eviction/none": 1}
    assert d["evictions"] == 2 and d["cold_after_eviction"] == 1
    assert d["costly_return_s"]["p50"] == 99.9  # 99.875, rounded to 0.1 s
    assert d["cold_wait_seconds"]["total"] == pytest.approx(129.8)
    assert d["cold_wait_seconds"]["mean"] == pytest.approx(32.45)


def test_diagnose_reads_the_servegen_minute_layout_as_simulate_does(tmp_path, capsys) -> None:
    # the 14-day file's layout (HashOwner,HashApp,HashFunction,Trigger,minute_1..): the first hour of a
    # two-hour slice; diagnose and simulate read it through the same reader, so they count the same
    from simulator.cli import main as simulate_main
    from simulator.diagnose import main

    counts = {"m-large.c001": [2, 0, 1] + [0] * 57 + [5] * 60, "m-mid.c002": [0, 1] + [0] * 58 + [3] * 60}
    inv = tmp_path / "invocations.csv"
    inv.write_text("HashOwner,HashApp,HashFunction,Trigger," + ",".join(f"minute_{i + 1}" for i in range(120))
                   + "\n" + "".join(f"{m},{m},{m},llm," + ",".join(map(str, c)) + "\n" for m, c in counts.items()))
    prof = tmp_path / "profile.csv"
    prof.write_text(SERVEGEN_PROFILE)
    args = [str(inv), "--profile", str(prof), "--gpus", "1", "--hours", "1"]
    assert main([*args, "--policy", "faascache", "--json", str(tmp_path / "d.json")]) == 0
    d = json.loads((tmp_path / "d.json").read_text())
    assert simulate_main(["simulate", *args, "--policies", "faascache", "--json", str(tmp_path / "s.json")]) == 0
    s = json.loads((tmp_path / "s.json").read_text())["policies"]["faascache"]
    assert s["requests"] == 4  # 2 + 1 + 1 in the first hour; the second hour's 480 cut
    assert d["cold_starts"] == s["cold_starts"] and d["cold_wait_seconds"] == s["cold_wait_seconds"]
    assert sum(d["classes"].values()) == d["cold_starts"] >= 2  # each model's first request is cold
    capsys.readouterr()
    assert main([*args[:-1], "0"]) == 2  # --hours 0
    assert "--hours must be positive" in capsys.readouterr().err
    assert main([str(tmp_path / "nope.csv")]) == 2
    assert "nope.csv" in capsys.readouterr().err
