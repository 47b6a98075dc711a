"""The warmup's pass rule (gpu_worker/runtimes/warmup.py): PREWARM_WARMUP_MAX_SECONDS is a hard ceiling
that no minimum number of passes overrides. Decided by a pure function of the latencies so far and the
elapsed seconds, and driven here by a clock the test advances itself (no real slow warmup, no timing)."""

from __future__ import annotations

from gpu_worker.runtimes.warmup import WarmupPolicy, another_pass, run_until_stable

POLICY = WarmupPolicy(min_passes=3, max_passes=10, tolerance=0.15, max_seconds=5.0)


def test_the_first_pass_always_runs() -> None:
    assert another_pass([], elapsed=0.0, policy=POLICY)
    assert another_pass([], elapsed=60.0, policy=POLICY)


def test_a_first_pass_past_the_ceiling_stops_the_warmup_before_the_minimum() -> None:
    # The probe's case: one pass longer than max_seconds; the old rule ran the 3 passes anyway.
    assert not another_pass([6.0], elapsed=6.0, policy=POLICY)
    assert not another_pass([6.0, 6.0], elapsed=12.0, policy=POLICY)


def test_a_pass_starts_only_when_it_is_expected_to_end_within_the_ceiling() -> None:
    assert another_pass([1.0], elapsed=1.0, policy=POLICY)  # ends near 2 s of 5
    assert another_pass([3.0, 1.0], elapsed=4.0, policy=POLICY)  # ends near 5 s: still within
    assert not another_pass([3.0, 1.5], elapsed=4.5, policy=POLICY)  # would end near 6 s


def test_stability_and_max_passes_still_stop_it() -> None:
    assert another_pass([0.5, 0.1], elapsed=0.6, policy=POLICY)  # below the minimum: keep going
    assert not another_pass([0.5, 0.1, 0.1], elapsed=0.7, policy=POLICY)  # stable after the minimum
    assert another_pass([0.5, 0.1, 0.2], elapsed=0.8, policy=POLICY)  # not stable yet
    assert not another_pass([0.1, 0.2] * 5, elapsed=1.5, policy=POLICY)  # 10 passes: the bound


class FakeClock:
    """A clock that moves only when a pass says how long it took."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_run_until_stable_stops_after_a_first_pass_past_the_ceiling_and_says_cut_short() -> None:
    clock = FakeClock()
    calls: list[float] = []

    def slow_pass() -> None:
        calls.append(clock.now)
        clock.now += 47.8  # the probe's warmup, in one pass

    fig = run_until_stable(slow_pass, POLICY, clock=clock)
    assert len(calls) == 1
    assert fig["passes"] == 1 and fig["cut_short"] and not fig["stable"]
    assert fig["first_ms"] == fig["latency_ms"] == 47800.0


def test_run_until_stable_runs_the_minimum_when_it_fits_and_is_not_cut_short() -> None:
    clock = FakeClock()
    took = iter([2.0, 0.5, 0.5, 0.5])

    def one_pass() -> None:
        clock.now += next(took)

    fig = run_until_stable(one_pass, POLICY, clock=clock)
    assert fig["passes"] == 3 and fig["stable"] and not fig["cut_short"]
    assert fig["first_ms"] == 2000.0 and fig["latency_ms"] == 500.0


def test_run_until_stable_stops_at_the_ceiling_after_the_minimum_without_saying_cut_short() -> None:
    clock = FakeClock()
    took = iter([1.0, 0.5, 1.5, 0.5, 1.5, 0.5, 1.5])  # never stable

    def one_pass() -> None:
        clock.now += next(took)

    fig = run_until_stable(one_pass, POLICY, clock=clock)
    # Elapsed after each pass: 1.0, 1.5, 3.0, 3.5, 5.0; each next pass was expected (elapsed + the last
    # latency) to end by 5.0 until the fifth: 5.0 + 1.5 would not.
    assert fig["passes"] == 5 and not fig["stable"] and not fig["cut_short"]
    assert clock.now - 100.0 == 5.0
