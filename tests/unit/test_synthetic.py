"""The seeded synthetic regimes (simulator.synthetic): each has the character it is named for, a seed gives the same
trace, and bad input is refused with a message."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import synthetic
from simulator.trace import GIB, default_load_seconds, load_profile, read_trace


def test_a_seed_gives_the_same_trace_and_another_seed_another() -> None:
    a = synthetic.generate("onoff", models=30, hours=2, requests=3000, seed=3)
    b = synthetic.generate("onoff", models=30, hours=2, requests=3000, seed=3)
    c = synthetic.generate("onoff", models=30, hours=2, requests=3000, seed=4)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert len(a[0]) != len(c[0]) or not np.array_equal(a[0], c[0])


@pytest.mark.parametrize("regime", synthetic.REGIMES)
def test_every_regime_gives_about_the_requests_asked_for_sorted_within_the_span(regime: str) -> None:
    times, mids = synthetic.generate(regime, models=50, hours=6, requests=20_000, seed=0)
    assert 0.9 * 20_000 <= len(times) <= 1.1 * 20_000
    assert np.all(np.diff(times) >= 0) and times[0] >= 0 and times[-1] < 6 * 3600
    assert mids.min() >= 0 and mids.max() < 50


def test_zipf_popularity_is_steady_and_shifting_popularity_is_redrawn() -> None:
    def top(times: np.ndarray, mids: np.ndarray, lo: float, hi: float) -> int:
        sel = (times >= lo) & (times < hi)
        return int(np.bincount(mids[sel], minlength=100).argmax())

    z = synthetic.generate("zipf", models=100, hours=8, requests=40_000, seed=1)
    s = synthetic.generate("shifting", models=100, hours=8, requests=40_000, seed=1, shift_h=4)
    assert top(*z, 0, 4 * 3600) == top(*z, 4 * 3600, 8 * 3600)
    assert top(*s, 0, 4 * 3600) != top(*s, 4 * 3600, 8 * 3600)
    # Zipf(1) over 100 models: the busiest carries about 1 / H(100) = 19 % of the requests
    share = np.bincount(z[1]).max() / len(z[1])
    assert 0.16 < share < 0.23


def test_onoff_models_fall_silent_and_periodic_timers_keep_their_period() -> None:
    times, mids = synthetic.generate("onoff", models=40, hours=24, requests=50_000, seed=2)
    active = np.zeros((40, 24 * 60), dtype=bool)
    active[mids, (times // 60).astype(int)] = True
    # most models are silent most of the day (bursts of ~10 min, silences of ~60 min at the Pareto scale)
    assert np.median(active.mean(axis=1)) < 0.5
    times, mids = synthetic.generate("periodic", models=40, hours=24, requests=50_000, seed=2)
    # some model's gaps sit at one of the timer periods, within the 2 s jitter
    periods = [60.0, 300.0, 600.0, 1800.0, 3600.0]
    timed = 0
    for m in range(40):
        gaps = np.diff(times[mids == m])
        if len(gaps) > 10 and any(np.median(np.abs(gaps - p)) < 5.0 for p in periods):
            timed += 1
    assert timed >= 10


def test_diurnal_rates_follow_a_day() -> None:
    times, _ = synthetic.generate("diurnal", models=1, hours=48, requests=50_000, seed=5)
    per_hour = np.bincount((times // 3600).astype(int), minlength=48)
    assert per_hour.max() > 5 * per_hour.min()  # 1 ± 0.9 over the day
    assert abs(int(per_hour[:24].argmax()) - int(per_hour[24:].argmax())) <= 2  # the same peak each day


def test_written_files_are_read_by_the_simulator(tmp_path) -> None:  # type: ignore[no-untyped-def]
    n = synthetic.write("zipf", tmp_path, models=20, hours=1, requests=2000, seed=0, min_gib=2, max_gib=8)
    trace = read_trace(tmp_path / "requests.csv", "requests")
    assert trace.requests == n and len(trace.models) <= 20
    sizes, loads = load_profile(tmp_path / "profile.csv", trace.models)
    assert np.all(sizes >= 2 * GIB) and np.all(sizes <= 8 * GIB)
    assert loads[0] == pytest.approx(default_load_seconds(int(sizes[0])), abs=1e-3)


@pytest.mark.parametrize(("args", "message"), [
    (["burst", "out"], "invalid choice"),
    (["zipf", "out", "--models", "0"], "need models >= 1"),
    (["zipf", "out", "--min-gib", "9", "--max-gib", "3"], "need 0 < min_gib <= max_gib"),
    (["zipf", "out", "--hours", "nan"], "finite hours > 0"),  # was "cannot convert float NaN to integer"
    (["zipf", "out", "--max-gib", "inf"], "need 0 < min_gib <= max_gib, finite"),
    (["zipf", "out", "--seed", "-1"], "--seed must be a whole number of at least 0, got -1"),
])
def test_bad_input_is_refused_with_a_message(args: list[str], message: str, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    args = [str(tmp_path / a) if a == "out" else a for a in args]
    try:
        rc = synthetic.main(args)
    except SystemExit as e:  # argparse refuses an unknown regime itself
        rc = int(e.code or 0)
    assert rc == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out" / "requests.csv").exists()


def test_the_synthetic_sweep_runs_every_policy_on_each_regime_and_writes_the_sweeps_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from simulator import synthetic_sweep

    rc = synthetic_sweep.main(["--regimes", "zipf,onoff", "--gpus", "1", "--seeds", "3", "--models", "12",
                               "--hours", "0.5", "--requests", "400", "--policies", "on-demand-lru,oracle,prewarm",
                               "--out", str(tmp_path)])
    assert rc == 0
    out = json.loads((tmp_path / "sweep.json").read_text())
    assert {(r["sample"], r["policy"]) for r in out["rows"]} == {
        (f"synthetic-{g}-s3", p) for g in ("zipf", "onoff") for p in ("on-demand-lru", "oracle", "prewarm")}
    # the traces are the generator's, for the seed asked
    times, _ = synthetic.generate("zipf", models=12, hours=0.5, requests=400, seed=3)
    assert next(r["requests"] for r in out["rows"] if r["sample"] == "synthetic-zipf-s3") == len(times)
    assert [p["best_baseline"] for p in out["points"]] == ["on-demand-lru", "on-demand-lru"]
    assert "synthetic-onoff-s3" in (tmp_path / "sweep.md").read_text()


def test_the_synthetic_sweep_refuses_an_unknown_regime_or_policy_or_a_bad_number(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from simulator import synthetic_sweep

    for argv, words in [
        (["--regimes", "zipf,burst"], "argument --regimes: unknown burst (known: zipf, shifting"),
        (["--policies", "lru"], "argument --policies: unknown lru (known: on-demand-lru"),
        (["--seeds", "0,one"], "argument --seeds: 'one' is not a whole number of at least 0"),
        (["--gpus", "4,8x"], "argument --gpus: '8x' is not a whole number of at least 1"),
        (["--seeds", "0,-1"], "argument --seeds: '-1' is not a whole number of at least 0"),  # numpy's words once
        (["--hours", "nan"], "argument --hours: 'nan' is not a number above 0"),
        (["--jobs", "0"], "argument --jobs: '0' is not a whole number of at least 1"),
    ]:
        with pytest.raises(SystemExit) as e:
            synthetic_sweep.main([*argv, "--out", str(tmp_path)])
        assert e.value.code == 2
        assert words in capsys.readouterr().err
    assert not (tmp_path / "traces").exists()
