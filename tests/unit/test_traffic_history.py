"""TrafficHistory.add_series (a model's buckets in one call, as a starting scheduler feeds its warm-up)
leaves the history in the state that add_bucket one count at a time leaves it in."""

from __future__ import annotations

import random

from prewarm.domain.policy import TrafficHistory
from prewarm.domain.policy.history import new_requests

SLOTS = ("first_second", "last_second", "total", "fed", "active_minutes", "last_minute", "rate_p", "rate_s", "rate_l",
         "rate_t", "hist", "oob", "gaps_seen", "weight", "stable_version", "stable_hist", "stable_oob", "stable_rpm", "starts")


def _state(h: TrafficHistory) -> tuple:
    models = {m: tuple(getattr(h._m[m], f) for f in SLOTS) for m in h.models()}
    co = {m: dict(sorted(h.co_starts(m).items())) for m in h.models()}
    # the record of refuted silences (silences.py) too: what ended, by the hour its verdict fell in
    return models, h.seq, list(h._changed.items()), h.changed_since(h.seq // 2), co, h.silences._hours


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


def test_starts_are_requests_after_the_start_gap_and_co_starts_pair_within_the_window() -> None:
    h = TrafficHistory(start_gap_s=300, partner_window_s=60)
    for model, t in [("a", 0), ("b", 30), ("c", 100),  # b within 60 s of a; c 70 s after b's start: no pair
                     ("a", 200),  # 200 s after a's last request: not a start
                     ("a", 500), ("b", 1000),  # both start again (300 s idle or more), 500 s apart: no pair
                     ("a", 2000), ("b", 1990), ("c", 2060)]:  # fed out of order; c is 60 s after a: a pair
        h.add(model, t)
    assert (h.starts("a"), h.starts("b"), h.starts("c")) == (3, 3, 2)
    assert h.co_starts("a") == {"b": 2, "c": 1}
    assert h.co_starts("b") == {"a": 2}  # b at 1990 and c at 2060: 70 s apart
    assert h.co_starts("c") == {"a": 1}
    assert h.recent_starts() == {"a": 2000, "c": 2060}  # b's 1990 is more than 60 s before the newest


def test_co_starts_do_not_depend_on_the_order_models_are_fed_in() -> None:
    """A warm-up feeds each model's series whole, one model after another: the pairs are the ones the
    same buckets give fed in time order."""
    rnd = random.Random(7)
    series = {f"m{i}": sorted({rnd.randrange(0, 6 * 3600) // 60 * 60 for _ in range(rnd.choice((3, 10, 40)))})
              for i in range(30)}
    in_time, by_model = TrafficHistory(), TrafficHistory()
    for t, model in sorted((t, m) for m, ts in series.items() for t in ts):
        in_time.add_bucket(model, t + 30, 1)
    for model, ts in series.items():
        by_model.add_series(model, [(t, 1) for t in ts], 30)
    assert _state(in_time)[4] == _state(by_model)[4]
    assert sum(sum(c.values()) for c in _state(in_time)[4].values()) > 20  # pairs were found


def test_a_mass_start_pairs_with_none_and_a_full_partner_table_drops_its_oldest_singleton() -> None:
    h = TrafficHistory(start_gap_s=300, partner_window_s=60, partner_max_group=3, partner_table=0)
    for i in range(5):  # five models start within a minute: the fifth finds 4 others started, over 3
        h.add(f"t{i}", 10.0 + i)
    assert h.co_starts("t3") == {"t0": 1, "t1": 1, "t2": 1}
    assert h.co_starts("t4") == {}
    h2 = TrafficHistory(start_gap_s=300, partner_window_s=60, partner_max_group=3, partner_table=2)
    for model, t in [("a", 0), ("b", 5),  # a: {b: 1}
                     ("a", 1000), ("b", 1001), ("c", 1002),  # a: {b: 2, c: 1}
                     ("a", 2000), ("d", 2001)]:  # the table is full: d takes c's place (c was seen once)
        h2.add(model, t)
    assert h2.co_starts("a") == {"b": 2, "d": 1}
    h2.add("a", 3000)
    h2.add("e", 3001)  # d is the only singleton: e replaces it
    h2.add("a", 4000)
    h2.add("b", 4001)
    assert h2.co_starts("a") == {"b": 3, "e": 1}


def test_a_start_earlier_than_one_already_paired_still_pairs_within_the_window() -> None:
    h = TrafficHistory(start_gap_s=300, partner_window_s=60)
    h.add("a", 1000)
    h.add("c", 1100)
    assert h.recent_starts() == {"c": 1100}  # a is over 60 s older than the newest: dropped
    h.add("b", 1070)  # earlier than c, paired since: within 60 s of c only
    assert h.co_starts("b") == {"c": 1} and h.co_starts("a") == {}


def test_a_record_following_the_stream_counts_every_request_after_the_histogram_halves() -> None:
    """The no-regret layer and the loads-ahead record take each plan() call's new requests from the history's
    count. That count once halved with the histogram: after it, a busy model's requests went missing until its
    count climbed back (on a 14-day view of ServeGen the layer saw 102,269 of 1,817,083 requests, and a
    greedy-dual whose busy models' frequencies stopped growing led the fleet to 4.8x the cold starts)."""
    h = TrafficHistory(halve_at=64.0)
    seq, seen, taken = -1, {}, 0.0
    for t in range(0, 60 * 500, 60):  # 500 one-minute gaps, past halve_at many times over
        h.add_bucket("busy", t, 3)
        if t % 600 == 0:
            h.add_bucket("quiet", t, 1)
        taken += sum(n for _t, m, n in new_requests(h, seq, seen) if m == "busy")
        seq = h.seq
        assert taken == 3 * (t // 60 + 1)
    assert h._m["busy"].total < 3 * 500 / 2  # the figure behind requests per active minute still halves
    assert h.requests_per_active_minute("busy") == 3.0
