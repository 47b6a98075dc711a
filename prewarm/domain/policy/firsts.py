"""First requests (issue 26, item 3): how often the catalog's never-requested models get theirs, and whether
the fill's replicas are asked for before they are evicted.

- The rate: at each plan() call (timeline.advance), the models whose first request came since the last call,
  over the unrequested models' exposure (how many were unrequested, times the seconds between calls), both
  decayed with `PolicyConfig.expert_halflife_s`. With nothing else known of a never-requested model, this is
  its expected requests per second, so it is what prewarm's value order holds a fill replica worth
  (`PolicyConfig.first_request_value`; Values.loss), where it was 0. The two families differ by about 8×:
  after the first hour an unrequested model is asked for within the next hour with P ≈ 0.05-0.35 on the
  Azure day (its sample holds only functions invoked that day), 0.01-0.04 on ServeGen's first 72 h, while a
  resident idle for hours is asked for with P ≈ 0.03-0.07 on both: a measured value, not a constant, ranks them.
- The fills' outcomes: a fill replica whose model is asked for while it is resident was *used*; one evicted or
  cancelled for room before that was *wasted* (decayed alike). A fill cancelled to give its link to a demand load
  (a yield, PlanCall.yield_link) is neither: it says the link was needed, nothing of whether the fill's memory
  was; counted, the empty fleet's first demand loads (a yield per GPU) closed the gate for the first two hours of
  Azure 1,350 × 32, whose fills are asked for ~85 % of the time (1,362 / 1,384 cold starts; not counted, 1,197 /
  1,199, and 1,192 / 1,188 with the link wait: docs/simulation.md, "The link wait on by default").
  The fill takes all free memory (`PolicyConfig.fill_share`) while at least as many are used as wasted, and keeps
  to `speculative_share` while not: on Azure 1,350 × 32 about 85 % of fills are asked for, on Azure 1,350 × 16
  about 6 % (filling all free memory there cost +0.7 % cold starts, and +1.6 % on ServeGen × 32 seed 0). The bar
  is a fill that pays for itself as often as not: a wasted one cost its link time, a used one saved a cold start.

Like the no-regret layer's and the loads-ahead records, this is a record of the stream and of the policy's own
fills, not a cache: a fresh PolicyState starts without it. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math

MIN_SCORED = 4.0  # decayed fill outcomes on record before they can hold the fill back (as ahead.py's record)


class FirstRequests:
    __slots__ = ("count", "exposure", "last_now", "unrequested", "used", "wasted")

    def __init__(self) -> None:
        self.count = 0.0  # decayed first requests
        self.exposure = 0.0  # decayed unrequested model-seconds
        self.last_now = -math.inf
        self.unrequested = 0  # unrequested models at the last call
        self.used = 0.0  # decayed fills whose model was asked for while they were resident
        self.wasted = 0.0  # decayed fills evicted before their model was asked for

    def observe(self, now: float, firsts: int, unrequested: int, halflife_s: float) -> None:
        """`firsts` models got their first request since the last call; `unrequested` have none now."""
        if self.last_now > -math.inf and now > self.last_now:
            dt = now - self.last_now
            d = 0.5 ** (dt / halflife_s)
            self.count *= d
            self.used *= d
            self.wasted *= d
            self.exposure = self.exposure * d + self.unrequested * dt
        self.count += firsts
        self.last_now = max(self.last_now, now)
        self.unrequested = unrequested

    def fills_asked(self, n: int) -> None:
        """`n` fill replicas (or floors) met their model's first request while resident."""
        self.used += n

    def fill_evicted(self) -> None:
        """A never-requested model's last replica was evicted or cancelled for room before its first request."""
        self.wasted += 1.0

    def fills_pay(self) -> bool:
        """Whether fills pay on this traffic: at least as many asked for while resident as evicted (or cancelled)
        unasked; with fewer than MIN_SCORED outcomes on record, they do."""
        if self.used + self.wasted < MIN_SCORED:
            return True
        return self.used >= self.wasted

    def rate(self) -> float:
        """First requests per second per unrequested model (0 before any exposure)."""
        return self.count / self.exposure if self.exposure > 0.0 else 0.0

    def why(self) -> str:
        """For the fill's reasons, the console and the leader's status: whether fills take all free memory and
        the record behind it."""
        head = "fills take all free memory" if self.fills_pay() else "fills keep to the speculative share"
        return (f"{head}: {self.used:.1f} asked for while resident, {self.wasted:.1f} evicted unasked (decayed); an "
                f"unrequested model is asked for at {self.rate() * 3600.0:.3g} per hour")
