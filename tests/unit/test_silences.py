"""The record of refuted silences (prewarm.domain.policy.silences): whether this fleet's streams stop or pause, which
chooses PolicyConfig.refute_stale_rate's "auto" reading."""

from __future__ import annotations

import math

from prewarm.domain.policy import TrafficHistory


def run(h: TrafficHistory, model: str, start: int, end: int, every: int) -> None:
    for s in range(start, end, every):
        h.add(model, float(s))


def test_streams_that_stop_refute_and_streams_that_pause_do_not() -> None:
    """Ten streams at 1 request every 2 s for 15 minutes: stopped, their silences are stops once each outlasts its
    refutation (4.6 requests' time, ~9 s) by a minute; paused for 30 s and resumed, pauses."""
    stops, pauses = TrafficHistory(), TrafficHistory()
    for i in range(10):
        run(stops, f"m{i}", 0, 900, 2)
        run(pauses, f"m{i}", 0, 900, 2)
        run(pauses, f"m{i}", 928, 1800, 2)  # 30 s without a request, then the stream goes on
    assert not stops.streams_stop(900.0)  # no verdict yet: the rate stands
    assert not stops.streams_stop(960.0)  # refuted at ~907 s, but the verdict waits a minute more
    assert stops.streams_stop(1000.0)
    assert (stops.silences.stopped, stops.silences.returned) == (10.0, 0.0)
    assert stops.silences.describe() == {"refuting_share": 0.333, "stops": 10.0, "pauses": 0.0}  # 1 of 3 reads
    assert not pauses.streams_stop(1000.0) and pauses.silences.returned == 10.0
    assert "valued by their idle-time model" in stops.silences.why()
    assert "keep their measured rate" in pauses.silences.why()


def test_a_first_requests_rate_is_not_judged() -> None:
    """A model asked for once has a rate of one request over the EWMA's 10 s floor; any silence refutes that
    guess, so only models whose EWMA was fed for its time constant (600 s) count."""
    h = TrafficHistory()
    for i in range(20):
        h.add(f"once{i}", float(i))
    run(h, "young", 0, 300, 2)  # 5 minutes, then silent
    assert not h.streams_stop(5000.0)
    assert (h.silences.stopped, h.silences.returned) == (0.0, 0.0)


def test_a_stop_is_counted_once_whether_read_before_its_return_or_not() -> None:
    """A stop judged while silent (read at its verdict) and then ended by a late return counts once; unread, it
    counts at its return; either way in the hour of its verdict, so the record does not depend on when it is read."""
    read, unread = TrafficHistory(), TrafficHistory()
    for h in (read, unread):
        run(h, "m", 0, 900, 2)
    assert read.streams_stop(2000.0) is False  # one stop: the return counted in advance still outweighs it
    for h in (read, unread):
        run(h, "m", 3000, 3900, 2)
    read.streams_stop(3900.0)
    unread.streams_stop(3900.0)
    assert read.silences._hours == unread.silences._hours == {0: [0.0, 1.0]}


def test_old_verdicts_fade() -> None:
    """A verdict weighs e^-1 six hours on (by its hour's middle): a day later ten stops weigh 10 e^-4, and the pauses
    of the day's second stretch outweigh them."""
    h = TrafficHistory()
    for i in range(10):
        run(h, f"m{i}", 0, 900, 2)
    assert h.streams_stop(1000.0)
    day = 24 * 3600
    for i in range(10):
        run(h, f"m{i}", day, day + 900, 2)
        run(h, f"m{i}", day + 928, day + 1800, 2)
    assert not h.streams_stop(day + 1800.0)
    assert abs(h.silences.stopped - 10 * math.exp(-4)) < 1e-9 and h.silences.returned == 10.0


def test_a_warm_up_of_minute_counts_is_not_judged() -> None:
    """A starting scheduler feeds per-minute counts (add_series, judge=False, scheduler.snapshot): a minute's count at
    one second would make each busy minute a refuted silence that ends, so they are left out of the record; the rest
    of the history is as judged."""
    series = [(60 * k, 30) for k in range(60)]  # 30 requests a minute for an hour
    judged, warm = TrafficHistory(), TrafficHistory()
    judged.add_series("m", series, 30)
    warm.add_series("m", series, 30, judge=False)
    assert judged.silences._hours and not warm.silences._hours
    assert judged.value_inputs("m") == warm.value_inputs("m")
    run(warm, "m", 3600, 4500, 2)  # the per-second feed after it is judged
    assert warm.silences._hours


def test_the_record_stays_bounded_where_nothing_reads_it() -> None:
    """With the reading fixed on or off, plan() never reads the record: a verdict every hour for ten days still keeps
    at most two days of hours (older ones weigh e^-8 and less)."""
    h = TrafficHistory()
    for hour in range(240):
        run(h, "m", hour * 3600, hour * 3600 + 900, 2)  # 15 minutes of requests, then a stop
    assert len(h.silences._hours) <= 49 and max(h.silences._hours) == 238  # each stop counted at its return
    assert all(c == [0.0, 1.0] for c in h.silences._hours.values())
