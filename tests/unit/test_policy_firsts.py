"""The first-request record (prewarm.domain.policy.firsts): how often never-requested models get their first
request, and whether fills pay."""

from __future__ import annotations

import pytest

from prewarm.domain.policy.firsts import MIN_SCORED, FirstRequests

HOUR = 3600.0


def test_the_rate_is_first_requests_over_unrequested_model_seconds_decayed() -> None:
    r = FirstRequests()
    assert r.rate() == 0.0  # no exposure yet
    r.observe(0.0, 0, 10, HOUR)
    r.observe(100.0, 2, 8, HOUR)  # 10 unrequested for 100 s, 2 of them asked for
    assert r.rate() == pytest.approx(2.0 / (10 * 100.0))
    r.observe(100.0 + HOUR, 0, 8, HOUR)  # an hour with no first request: the record halves, exposure grows
    assert r.count == pytest.approx(1.0)
    assert r.exposure == pytest.approx(10 * 100.0 * 0.5 + 8 * HOUR)
    assert r.rate() == pytest.approx(1.0 / (10 * 100.0 * 0.5 + 8 * HOUR))


def test_an_observation_out_of_order_decays_nothing() -> None:
    r = FirstRequests()
    r.observe(50.0, 0, 4, HOUR)
    r.observe(40.0, 1, 3, HOUR)
    assert (r.count, r.exposure, r.last_now, r.unrequested) == (1.0, 0.0, 50.0, 3)


def test_fills_pay_until_more_are_evicted_unasked_than_asked_for() -> None:
    r = FirstRequests()
    assert r.fills_pay()  # nothing on record
    r.wasted = MIN_SCORED - 1.0
    assert r.fills_pay()  # too few outcomes to hold the fill back
    r.wasted, r.used = 6.0, 5.0
    assert not r.fills_pay()
    r.used = 6.0
    assert r.fills_pay()
    r.observe(0.0, 0, 1, HOUR)
    r.observe(HOUR, 0, 1, HOUR)  # both decay alike: the verdict stands
    assert (r.used, r.wasted) == (3.0, 3.0) and r.fills_pay()


def test_why_says_where_the_fill_stands_and_the_record_behind_it() -> None:
    r = FirstRequests()
    r.observe(0.0, 0, 10, HOUR)
    r.observe(HOUR, 0, 10, HOUR)
    r.count, r.used, r.wasted = 5.0, 1.0, 6.0
    assert r.why() == ("fills keep to the speculative share: 1.0 asked for while resident, 6.0 evicted unasked "
                       "(decayed); an unrequested model is asked for at 0.5 per hour")
    r.used = 6.0
    assert r.why().startswith("fills take all free memory: 6.0 asked for while resident")
