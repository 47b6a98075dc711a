"""`prewarm bench live`: its options, and the mapping of a trace onto the bench catalog (the full run starts a
fleet per policy and takes minutes: it is run by hand, its figures are in docs/simulation.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.live import workload
from bench.live.cli import cmd_bench_live
from prewarm.programs.cli import build_parser

REPO = Path(__file__).resolve().parents[2]


def azure_csv(path: Path, rows: dict[str, list[int]]) -> Path:
    minutes = len(next(iter(rows.values())))
    lines = ["HashOwner,HashApp,HashFunction,Trigger," + ",".join(str(i + 1) for i in range(minutes))]
    lines += [f"o,a,{fn},http," + ",".join(map(str, counts)) for fn, counts in rows.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bench_live_is_registered_with_the_issue_options() -> None:
    args = build_parser().parse_args(["bench", "live", "--trace", "t.csv", "--minutes", "5", "--speed", "10",
                                      "--policies", "prewarm,faascache", "--json"])
    assert args.func is cmd_bench_live
    assert (args.trace, args.minutes, args.speed, args.policies, args.json) == ("t.csv", 5.0, 10.0,
                                                                                "prewarm,faascache", True)
    assert build_parser().parse_args(["bench", "live"]).policies == "prewarm,faascache,on-demand-lru"


def test_bench_live_refuses_an_unknown_policy_naming_the_ones_it_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "prewarm.programs.cli", "bench", "live", "--policies", "prewarm,lru"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "'lru' is not a policy" in out.stderr and "on-demand-lru, keepalive-10m, faascache" in out.stderr


def test_the_busiest_functions_map_onto_the_catalog_busiest_first_thinned_to_the_rate(tmp_path) -> None:
    rows = {"quiet": [0, 1, 0, 0, 1, 0], "busy": [300] * 6, "mid": [20, 0, 20, 0, 20, 0], "late": [0] * 5 + [500]}
    trace = azure_csv(tmp_path / "t.csv", rows)
    wl = workload.build(trace, minutes=5, speed=10, n_models=2, rate=10.0)
    # "late" has no request in the first 5 minutes; "quiet" is third: left out
    assert wl.models == ["bench-00", "bench-01"] and wl.functions == ["busy", "mid"]
    assert wl.span_s == 30.0 and wl.trace_requests == 1500 + 60
    assert len(wl.times) and np.all(np.diff(wl.times) >= 0) and wl.times[-1] < wl.span_s
    n = np.bincount(wl.mids, minlength=2)
    assert abs(len(wl.times) - 10.0 * 30) <= 40, len(wl.times)  # near the rate (thinning is random)
    assert n[1] == 60  # the rarer model is kept whole: min(1, c / n^0.75) is 1 for it
    again = workload.build(trace, minutes=5, speed=10, n_models=2, rate=10.0)
    assert np.array_equal(again.times, wl.times) and np.array_equal(again.mids, wl.mids)  # seeded


def test_the_replay_loads_are_the_entries_written_after_the_read_before_it() -> None:
    from bench.live.run import _replay_loads
    from prewarm.store.load_times import KEPT, Measured

    before = {"a": Measured([0.2, 0.1]), "b": Measured([0.3]), "c": Measured([])}
    after = {"a": Measured([0.9, 0.8, 0.7, 0.2, 0.1]),  # three loads in the replay, newest first
             "b": Measured([0.5] * KEPT),  # trimmed: at least KEPT - 1 of them are the replay's
             "c": Measured([])}
    got = _replay_loads(before, after)
    assert got == {"a": [0.9, 0.8, 0.7], "b": [0.5] * (KEPT - 1), "c": []}


def test_the_contention_is_median_minus_median_and_sparse_models_take_the_fleet_median() -> None:
    from bench.live.run import contention

    alone = {"a": [0.1, 0.3, 0.2], "b": [0.5], "c": [0.4], "d": [], "e": [0.9]}
    # a: 0.6 - 0.2 = 0.4; b: 2.0 - 0.5 = 1.5; e: faster in the replay, 0 (not negative); c has 2 replay loads
    # (< 3) and d none measured alone: both take the median of 0.4, 1.5 and 0
    replay = {"a": [0.4, 0.6, 0.8], "b": [1.0, 2.0, 2.0, 3.0, 2.5], "c": [4.0, 4.0], "d": [1.0, 1.0, 1.0],
              "e": [0.5, 0.5, 0.5]}
    got = contention(alone, replay)
    assert got == pytest.approx({"a": 0.4, "b": 1.5, "c": 0.4, "d": 0.4, "e": 0.0})
    assert contention(alone, {}) == dict.fromkeys(alone, 0.0)  # nothing to measure: no change
