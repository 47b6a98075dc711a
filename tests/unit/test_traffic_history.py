"""TrafficHistory.add_series (a model's buckets in one call, as a starting scheduler feeds its warm-up)
leaves the history in the state that add_bucket one count at a time leaves it in."""

from __future__ import annotations

import random

from scheduler.policy import TrafficHistory

SLOTS = ("first_second", "last_second", "total", "active_minutes", "last_minute", "rate_p", "rate_s", "rate_l",
         "rate_t", "hist", "oob", "gaps_seen", "weight", "stable_version", "stable_hist", "stable_oob", "stable_rpm")


def _state(h: TrafficHistory) -> tuple:
    models = {m: tuple(getattr(h._m[m], f) for f in SLOTS) for m in h.models()}
    return models, h.seq, list(h._changed.items()), h.changed_since(h.seq // 2)


def test_a_series_in_one_call_leaves_the_history_as_its_buckets_one_by_one() -> None:
    rnd = random.Random(4)
    feeds: list[tuple[str, list[tuple[int, int]]]] = []
    for i in range(40):
        t, series = rnd.randrange(0, 600), []
        for _ in range(rnd.choice((1, 3, 40, 3000))):  # 3,000 gaps: past halve_at, so counts are halved
            series.append((t, rnd.choice((0, 1, 1, 2, 7))))  # zero counts are no request
            t += rnd.choice((1, 60, 60, 60, 600, 20000))  # beyond the histogram's span too
        if i % 7 == 0 and len(series) > 2:
            series.insert(len(series) // 2, (series[0][0] + 1, 3))  # a late bucket: counts and rates, no gap
        feeds.append((f"m{i % 25}", series))  # some models fed twice
    one, bulk = TrafficHistory(), TrafficHistory()
    for k, (model, series) in enumerate(feeds):
        for t, c in series:
            one.add_bucket(model, t + 30, c)
        bulk.add_series(model, series, 30)
        if k % 5 == 0:  # single buckets in between, as the per-second feed does
            one.add_bucket("other", 100 + k, 2)
            bulk.add_bucket("other", 100 + k, 2)
    assert _state(one) == _state(bulk)
    assert any(one._m[m].stable_version > 10 for m in one.models())  # refreshed many times
    assert any(one._m[m].weight < one._m[m].gaps_seen for m in one.models())  # and halved
    bulk.add_series("none", [(5, 0), (9, 0)])  # only zero counts: no model, no change
    assert "none" not in bulk.models() and _state(one) == _state(bulk)
