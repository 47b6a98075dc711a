"""The cold-start SLO that steers the speculative budget (issue 14 item 4): PREWARM_COLD_START_SLO's
parsing, the pure controller's rule (bounded steps up on a breach, down after a window back under), and
the live scheduler doing it from the route hook's counts, with `slo` events and its state in Redis."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import redis
import requests

from prewarm import events, keys
from prewarm.config import ColdStartSlo, Settings, parse_slo
from prewarm.domain import slo
from prewarm.domain.policy.types import PolicyConfig
from prewarm.store import lookup_counts, slo_state
from scheduler.steering import Steering
from tests.procs import wait_for
from tests.scheduler_procs import SchedulerProc
from tests.web_support import WebProc, make_catalog

SHARE = ColdStartSlo("share", 0.05, 900.0)


# --- PREWARM_COLD_START_SLO ------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("share=0.05,window=15m", ColdStartSlo("share", 0.05, 900.0)),
    ("share=5%", ColdStartSlo("share", 0.05, 900.0)),
    ("p95=10s", ColdStartSlo("p95", 10.0, 900.0)),
    (" p95 = 1m , window = 1h ", ColdStartSlo("p95", 60.0, 3600.0)),
    ("", None),
])
def test_the_slo_setting_is_read(text: str, want: ColdStartSlo | None) -> None:
    assert parse_slo(text) == want


@pytest.mark.parametrize("text, says", [
    ("share=0.05,p95=10s", "exactly one of share or p95"),
    ("window=15m", "exactly one of share or p95"),
    ("share=1.5", "between 0 and 1"),
    ("share=abc", "share=0.05,window=15m"),
    ("p95=10 parsecs", "cannot read '10 parsecs' as a duration"),
    ("share=0.05,window=10s", "at least 1m"),
    ("share=0.05,share=0.1", "share is given twice"),
    ("0.05", "cannot read '0.05'"),
])
def test_a_bad_slo_setting_says_what_to_write(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="PREWARM_COLD_START_SLO") as exc:
        Settings.from_env({"PREWARM_COLD_START_SLO": text})
    assert says in str(exc.value)


# --- the controller (pure) -------------------------------------------------------------------------
def _run(fig: slo.WindowFigures, st: slo.SloState, now: float) -> tuple[slo.SloState, slo.Decision | None]:
    return slo.step(SHARE, st, fig, now, 0.6)


BREACH = slo.WindowFigures(lookups=100, not_ready=20)  # 20 % > 5 %
UNDER = slo.WindowFigures(lookups=100, not_ready=2)


def test_a_breach_raises_the_budget_in_bounded_steps() -> None:
    st, d = _run(BREACH, slo.SloState(), 0.0)
    assert d is not None and d.direction == "up" and st.level == 1 and d.share == pytest.approx(0.7)
    assert "20.0%" in d.reason and "5.0%" in d.reason and "70%" in d.reason
    st, d = _run(BREACH, st, 10.0)  # too soon after a step: its loads have not shown yet
    assert d is None and st.level == 1
    now = 0.0
    for _ in range(10):
        now += slo.SETTLE_SHARE * SHARE.window_s
        st, d = _run(BREACH, st, now)
    assert st.level == slo.MAX_LEVEL and slo.share_at(0.6, st.level) == pytest.approx(0.9)
    assert slo.share_at(0.9, slo.MAX_LEVEL) == slo.MAX_SHARE  # never the whole GPU


def test_the_budget_comes_down_after_a_whole_window_under_the_line() -> None:
    st, _ = _run(BREACH, slo.SloState(), 0.0)
    st, _ = _run(BREACH, st, 200.0)
    assert st.level == 2
    st, d = _run(UNDER, st, 300.0)
    assert d is None and st.under_since == 300.0
    st, d = _run(UNDER, st, 300.0 + SHARE.window_s - 1)
    assert d is None and st.level == 2
    st, d = _run(UNDER, st, 300.0 + SHARE.window_s)
    assert d is not None and d.direction == "down" and st.level == 1
    st, d = _run(UNDER, st, 300.0 + SHARE.window_s + 60)  # the next step down waits another window
    assert d is None and st.level == 1
    st, d = _run(BREACH, st, 300.0 + 2 * SHARE.window_s)  # a breach resets the time under the line
    assert st.under_since is None


def test_a_quiet_window_says_nothing() -> None:
    st, d = _run(slo.WindowFigures(lookups=slo.MIN_LOOKUPS - 1, not_ready=slo.MIN_LOOKUPS - 1), slo.SloState(), 0.0)
    assert d is None and st.level == 0 and st.value is None


def test_a_p95_line() -> None:
    p95 = ColdStartSlo("p95", 10.0, 600.0)
    st, d = slo.step(p95, slo.SloState(), slo.WindowFigures(50, 5, p95_seconds=20.0), 0.0, 0.6)
    assert d is not None and st.level == 1 and "20.0 s" in d.reason
    st, d = slo.step(p95, st, slo.WindowFigures(50, 0, p95_seconds=None), 1.0, 0.6)
    assert d is None and st.level == 1  # no cold start completed: no measure, the budget holds


def test_the_config_changes_only_with_the_level() -> None:
    cfg = PolicyConfig(speculative_share=0.6)
    assert slo.configured(cfg, 0.6, slo.SloState(), 0.3) is cfg  # the policy's caches survive a quiet tick
    raised = slo.configured(cfg, 0.6, slo.SloState(level=2), 0.3)
    assert raised.speculative_share == pytest.approx(0.8) and raised.p_prefetch == pytest.approx(0.3 * 0.75 ** 2)


# --- against Redis: the route hook's counts in, the budget and the event out --------------------------
def test_steering_reads_the_window_and_resumes_its_level(r: redis.Redis) -> None:
    now = 1_800_000_000.0
    for i in range(30):
        lookup_counts.count_lookup(r, "alpha", None if i % 3 == 0 else ("alpha", "v1", "node-a/cpu:0"), now - i)
    steer = Steering(ColdStartSlo("share", 0.05, 600.0), PolicyConfig(speculative_share=0.6))
    cfg = steer.tick(r, PolicyConfig(speculative_share=0.6), now)
    assert cfg.speculative_share == pytest.approx(0.7)
    [ev] = events.read(r, kind="slo")
    assert ev.numbers["direction"] == "up" and ev.numbers["lookups"] == 30 and ev.numbers["not_ready"] == 10
    rec = slo_state.read(r)
    assert rec is not None and rec["level"] == 1 and rec["speculative_share"] == pytest.approx(0.7)
    again = Steering(ColdStartSlo("share", 0.05, 600.0), PolicyConfig(speculative_share=0.6))  # a new leader carries on at that level
    assert again.tick(r, PolicyConfig(speculative_share=0.6), now + 1).speculative_share == pytest.approx(0.7)
    assert len(events.read(r, kind="slo")) == 1  # within the settling time: no second step


def test_a_one_minute_window_read_just_after_the_minute_turns_holds_the_minute_before(r: redis.Redis) -> None:
    """The window is the minutes it touches, never shorter than asked: lookups in the last seconds of a minute
    still count for a 1-minute window read a second into the next (they were lost there before)."""
    turn = 1_800_000_000.0  # a whole minute
    for i in range(slo.MIN_LOOKUPS + 5):
        lookup_counts.count_lookup(r, "alpha", None, turn - 30 + i)
    assert lookup_counts.read_window(r, turn + 1, 60).total(lookup_counts.NOT_READY) == slo.MIN_LOOKUPS + 5
    assert lookup_counts.read_window(r, turn + 61, 60).total(lookup_counts.NOT_READY) == 0  # a minute on: gone
    steer = Steering(ColdStartSlo("share", 0.05, 60.0), PolicyConfig(speculative_share=0.6))
    assert steer.tick(r, PolicyConfig(speculative_share=0.6), turn + 1).speculative_share == pytest.approx(0.7)
    assert [ev.numbers["direction"] for ev in events.read(r, kind="slo")] == ["up"]


@pytest.mark.slow
def test_a_real_scheduler_raises_its_budget_on_cold_lookups(redis_url: str, r: redis.Redis, tmp_path: Path) -> None:
    """Cold route lookups through a real web process (no GPU: every one is cold) breach the line; the real
    scheduler's next tick says so in the event log and keeps the raised budget in Redis."""
    catalog = make_catalog(tmp_path / "models")
    web = WebProc(redis_url, catalog, tmp_path, workers=1)
    sched = SchedulerProc(redis_url, catalog, tmp_path, env={"PREWARM_COLD_START_SLO": "share=0.05,window=1m"})
    try:
        wait_for(sched.is_leader, 60, what="the scheduler to lead", log=sched.log)
        for _ in range(slo.MIN_LOOKUPS + 5):
            assert requests.get(f"{web.url}/hooks/route", params={"model": "alpha"}, timeout=10).status_code == 200
        wait_for(lambda: events.read(r, kind="slo"), 60, what="an slo event", log=sched.log)
        ev = events.read(r, kind="slo")[-1]
        assert ev.actor == "scheduler" and ev.numbers["direction"] == "up" and ev.numbers["value"] == 1.0
        assert ev.numbers["speculative_share"] == pytest.approx(0.7) and "above the SLO line" in ev.reason
        rec = json.loads(r.get(keys.SLO_STATE))
        assert rec["breached"] is True and rec["level"] >= 1 and math.isclose(rec["target"], 0.05)
    finally:
        sched.stop()
        web.stop()
