"""The sweep over both trace families (issue 26): its points, the gap closed, the seconds waited,
and a run on a ServeGen-layout folder. Every figure is worked out by hand in the comments."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.policies import POLICIES
from simulator.sweep import gap_closed, markdown, point_summary, sweep_points
from simulator.sweep import main as sweep_main
from simulator.trace import GIB

from .test_sim_slots import SIZES, TEN, THREE, sim_of

# the keys every sweep row had before issue 26: a kept Azure row and a new one both carry them
ROW_KEYS_BEFORE = {"sample", "gpus", "seed", "policy", "models", "requests", "cold_starts", "loads",
                   "bytes_loaded", "memory_gib_hours", "wait_seconds", "queued_loads", "runtime_s"}


# ---- the points --------------------------------------------------------------------------------

def test_the_sweep_has_the_twelve_azure_points_and_the_six_servegen_points_at_72_hours() -> None:
    pts = sweep_points()
    sg = [(p.gpus, p.seed, p.hours, p.sample.fmt) for p in pts if p.sample.family == "servegen"]
    assert sorted(sg) == [(g, s, 72.0, "azure-minute") for g in (8, 16, 32) for s in (0, 1)]
    assert {p.sample.name for p in pts if p.sample.family == "servegen"} == {"servegen-lang-14d"}
    az = [p for p in pts if p.sample.family == "azure"]
    assert len(az) == 12 and {p.hours for p in az} == {None}  # the Azure samples replay whole
    assert [p.name for p in sweep_points("servegen")] == [p.name for p in pts if p.sample.family == "servegen"]


def test_points_narrow_the_sweep_and_a_pattern_matching_nothing_is_refused() -> None:
    got = sweep_points(select=["servegen*:16", "azure2019-500:8:1"])
    assert [p.name for p in got] == ["azure2019-500:8:1", "servegen-lang-14d:16:0", "servegen-lang-14d:16:1"]
    assert [p.hours for p in sweep_points("servegen", gpus=[8], seeds=[0], hours=6.0)] == [6.0]
    with pytest.raises(ValueError, match="matches none"):
        sweep_points("azure", select=["servegen-lang-14d"])  # not in the azure family
    with pytest.raises(ValueError, match="SAMPLE"):
        sweep_points(select=["a:1:2:3"])
    with pytest.raises(ValueError, match="--family"):
        sweep_points("gcp")
    with pytest.raises(ValueError, match="no sample of family"):
        sweep_points("servegen", samples=["tiny"])  # a folder outside the catalogue is family 'other'


# ---- the gap closed ----------------------------------------------------------------------------

def row(policy: str, cold: int, wait: float | None = None) -> dict:
    r = {"sample": "s", "gpus": 8, "seed": 0, "policy": policy, "cold_starts": cold, "bytes_loaded": GIB * 1024,
         "memory_gib_hours": {"total": 100.0}}
    if wait is not None:
        r["cold_wait_seconds"] = {"total": wait, "mean": wait / cold}
    return r


def test_gap_closed_by_hand() -> None:
    # best 100, oracle 20: a gap of 80 cold starts
    assert gap_closed(60, 100, 20) == 0.5  # 40 of the 80 removed
    assert gap_closed(100, 100, 20) == 0.0  # the best baseline's figure: nothing closed
    assert gap_closed(120, 100, 20) == -0.25  # worse than the best: a negative share
    assert gap_closed(10, 100, 20) == 1.125  # fewer than the oracle: above 1
    # no gap: the best baseline already has the oracle's cold starts (or fewer), or no oracle ran
    assert gap_closed(50, 50, 50) is None
    assert gap_closed(40, 50, 60) is None
    assert gap_closed(40, 50, None) is None


def test_the_table_gives_gap_closed_and_waits_and_says_no_gap_rather_than_divide_by_zero() -> None:
    # prewarm 60 cold starts waiting 300 s in all; faascache 100 waiting 600 s (the best baseline:
    # forecast has 120); oracle 20: gap closed (100 − 60) ÷ (100 − 20) = 0.50, waits 300 ÷ 600 = 0.50
    rows = [row("prewarm", 60, 300.0), row("faascache", 100, 600.0), row("forecast", 120, 50.0), row("oracle", 20)]
    s = point_summary({r["policy"]: r for r in rows})
    assert s is not None and s["best_baseline"] == "faascache" and s["gap"] == 80 and s["gap_closed"] == 0.5
    assert s["prewarm_over_best"] == 0.6 and s["prewarm_cold_wait_seconds"] == 300.0
    md = markdown(rows, 2)
    assert "| s | 8 | 0 | 60 | faascache 100 | **0.60** | 20 | **0.50** | 300 (0.50) | 1.0 (1.00) | 100 (1.00) |" in md
    # the every-policy waits table: the oracle's row has no waits (a row from before issue 26)
    assert "| s | 8 | 0 | 600 | 50 | — | 300 |" in md
    # best == oracle: no gap, said so
    same = [row("prewarm", 50, 10.0), row("faascache", 50, 10.0), row("oracle", 50, 10.0)]
    assert point_summary({r["policy"]: r for r in same})["gap_closed"] is None  # type: ignore[index]
    assert "| s | 8 | 0 | 50 | faascache 50 | **1.00** | 50 | no gap | 10 (1.00) |" in markdown(same, 2)
    # no oracle run: no gap to speak of either, shown as a dash
    assert "| s | 8 | 0 | 50 | faascache 50 | **1.00** | — | — |" in markdown(same[:2], 2)


# ---- the seconds waited ------------------------------------------------------------------------

def test_cold_wait_total_and_mean_by_hand() -> None:
    # The slot engine's worked case (test_sim_slots): one 4 GiB GPU, 2 slots, 10 s loads, A@0, B@1,
    # C@2 wait 19, 20 and 28 s. A@25 is warm (A ready at 19): it waits nothing and is not counted.
    # D (5 GiB) fits no GPU: its request is unserved, counted there and not in the seconds.
    # total 19 + 20 + 28 = 67 s over 3 cold requests served: mean 22.33 s.
    sizes = dict(SIZES, D=5.0)
    sim = sim_of([*THREE, (25.0, "A"), (26.0, "D")], sizes, dict(TEN, D=10.0))
    sim.run(POLICIES["on-demand-lru"]())
    res = sim.results()
    assert res["cold_starts"] == 4 and res["unserved"] == 1
    assert res["cold_wait_seconds"]["total"] == pytest.approx(67.0)
    assert res["cold_wait_seconds"]["mean"] == pytest.approx(67.0 / 3)
    assert res["wait_seconds"]["p50"] == pytest.approx(20.0)  # beside the percentiles


def test_a_run_with_no_cold_request_waits_zero_seconds() -> None:
    sim = sim_of([(100.0, "A")], SIZES, TEN)
    sim.run(POLICIES["oracle"]())  # loads A its load time ahead of its request: warm
    w = sim.results()["cold_wait_seconds"]
    assert sim.cold == 0 and w == {"total": 0.0, "mean": 0.0}


# ---- a sweep on a ServeGen-layout folder -------------------------------------------------------

def servegen_folder(tmp_path):
    """`<traces>/servegen-lang-14d` in ServeGen's layout: HashOwner,HashApp,HashFunction,Trigger, then
    minute_1..minute_120; models named tier.client with the tiers' profile sizes (15.2 / 29.4 / 65 GB)."""
    d = tmp_path / "traces" / "servegen-lang-14d"
    d.mkdir(parents=True)
    models = ["m-small.c001", "m-mid.c002", "m-large.c003", "m-mid.c004"]
    counts = np.random.default_rng(3).poisson(0.5, (len(models), 120))
    lines = ["HashOwner,HashApp,HashFunction,Trigger," + ",".join(f"minute_{i + 1}" for i in range(120))]
    lines += [f"{m},{m},{m},llm," + ",".join(map(str, c)) for m, c in zip(models, counts, strict=True)]
    (d / "invocations.csv").write_text("\n".join(lines) + "\n")
    tier = {"m-small": (15_200_000_000, 10.0), "m-mid": (29_400_000_000, 17.9), "m-large": (65_000_000_000, 37.8)}
    (d / "profile.csv").write_text("model,size_bytes,load_seconds\n" + "".join(
        f"{m},{tier[m.split('.')[0]][0]},{tier[m.split('.')[0]][1]}\n" for m in models))
    return tmp_path / "traces", counts


def test_sweep_runs_the_servegen_family_alone_on_a_short_horizon(tmp_path, capsys) -> None:
    traces, counts = servegen_folder(tmp_path)
    common = ["--traces", str(traces), "--family", "servegen", "--gpus", "1", "--seeds", "0", "--jobs", "2"]
    assert sweep_main([*common, "--hours", "1", "--policies", "faascache,prewarm,oracle",
                       "--out", str(tmp_path / "a")]) == 0
    data = json.loads((tmp_path / "a" / "sweep.json").read_text())
    assert {r["policy"] for r in data["rows"]} == {"faascache", "prewarm", "oracle"}
    for r in data["rows"]:
        assert ROW_KEYS_BEFORE <= set(r)  # only added to
        assert r["family"] == "servegen" and r["hours"] == 1.0
        assert r["requests"] == int(counts[:, :60].sum())  # the first hour's minutes only
        assert set(r["cold_wait_seconds"]) == {"total", "mean"}
    (pt,) = data["points"]
    assert (pt["sample"], pt["gpus"], pt["seed"], pt["family"]) == ("servegen-lang-14d", 1, 0, "servegen")
    assert pt["best_baseline"] == "faascache" and "gap_closed" in pt
    assert "| servegen-lang-14d (1 h) | 1 | 0 |" in (tmp_path / "a" / "sweep.md").read_text()
    # rerunning one policy over those rows at another horizon would mix horizons: refused
    capsys.readouterr()
    assert sweep_main([*common, "--hours", "2", "--policies", "prewarm", "--keep",
                       str(tmp_path / "a" / "sweep.json"), "--out", str(tmp_path / "b")]) == 2
    assert "mix horizons" in capsys.readouterr().err and not (tmp_path / "b").exists()
    # keeping prewarm's rows made with other prewarm switches would mix them: refused; rerunning prewarm is not
    assert sweep_main([*common, "--hours", "1", "--policies", "faascache", "--link-wait", "off", "--keep",
                       str(tmp_path / "a" / "sweep.json"), "--out", str(tmp_path / "b")]) == 2
    assert "ran with link_wait=True, this run has False" in capsys.readouterr().err and not (tmp_path / "b").exists()
    assert sweep_main([*common, "--hours", "1", "--policies", "prewarm", "--refute-stale-rate", "off", "--keep",
                       str(tmp_path / "a" / "sweep.json"), "--out", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "b" / "sweep.json").read_text())["refute_stale_rate"] == "off"
    # the Azure family is not in this folder: a clear error naming the missing files
    assert sweep_main(["--traces", str(traces), "--family", "azure"]) == 2
    assert "azure2019-1350/invocations.csv" in capsys.readouterr().err
