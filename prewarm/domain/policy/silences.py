"""Whether this fleet's streams stop or pause: the record behind PolicyConfig.refute_stale_rate's "auto".

A model's long-rate EWMA, as it stood at its last request, is refuted by a silence of STALE_REQUESTS / rate
(value.stale). What follows the refutation tells a stream that stopped from one that paused: it returns within
max(that silence, a minute) more (returned) or not (stopped). Counted fleet-wide by the hour the verdict fell in,
decayed over DECAY_S; the refutation applies while stops outweigh returns (one return counted in advance).
Only models whose EWMA has been fed for its time constant count: a first request's rate is a guess that any
silence refutes (without that, the synthetic regimes' first half hour read as stops).

Measured (the share of pauses, decayed as here, at its lowest over each run): Azure 2019 1,350 0.63, 500 0.99,
ServeGen 0.71, the stream view 0.61, synthetic zipf / shifting / periodic / diurnal 0.75; synthetic on/off 0.23–0.37
from its third hour. The families differ in what such a silence means, so the reading is chosen at run time
(docs/simulation.md, "A stopped stream's rate, chosen at run time")."""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappop, heappush

# the verdict waits this long at least after the refutation (a minute: the traces' and the histogram's grain)
MIN_WAIT_S = 60.0
DECAY_S = 6 * 3600.0
HOUR_S = 3600.0
PRIOR_RETURNS = 1.0  # counted in advance: the first verdict alone does not refute
KEEP_HOURS = int(8 * DECAY_S / HOUR_S)  # older hours weigh e^-8 and less: dropped


def verdict_at(last: float, s0: float) -> float:
    """When a silence from `last`, refuted after `s0`, is judged a stop if no request came."""
    return last + s0 + max(s0, MIN_WAIT_S)


class Silences:
    """The record of refuted silences (the module docstring): fed by TrafficHistory, read by plan() each call."""

    def __init__(self) -> None:
        self._due: list[tuple[float, str]] = []  # (no verdict before, model): one entry per watched model
        self._watched: set[str] = set()
        self._counted: dict[str, int] = {}  # model -> the last request whose silence was counted a stop
        self._hours: dict[int, list[float]] = {}  # hour -> [returned, stopped]
        self.returned = 0.0  # the decayed counts as of the last stop() call
        self.stopped = 0.0
        self.reads = 0  # stop() calls, and those that refuted (a replay's summary: describe())
        self.refuting = 0

    def watch(self, model: str, last: int) -> None:
        """`model`'s silence from `last` is one to judge (its EWMA is fed enough)."""
        if model not in self._watched:
            self._watched.add(model)
            heappush(self._due, (last + MIN_WAIT_S, model))

    def ended(self, model: str, last: int, second: int, s0: float) -> None:
        """A silence from `last` to `second` ended; `s0`: the silence that refuted the rate at `last`."""
        if second - last > s0:
            v = verdict_at(last, s0)
            if second < v:
                self._add(second, 0)
            elif self._counted.get(model) != last:
                self._add(v, 1)
        self._counted.pop(model, None)

    def _add(self, t: float, stopped: int) -> None:
        hour = int(t // HOUR_S)
        c = self._hours.get(hour)
        if c is None:
            self._drop_before(hour - KEEP_HOURS)  # bounded where nothing reads it (the reading fixed on or off)
            c = self._hours[hour] = [0.0, 0.0]
        c[stopped] += 1.0

    def _drop_before(self, hour: int) -> None:
        for h in [h for h in self._hours if h < hour]:
            del self._hours[h]

    def stop(self, now: float, current: Callable[[str], tuple[int, float] | None]) -> bool:
        """Stops outweigh returns in the decayed record as of `now`. `current(model)`: its silence now, as (last
        request, the silence that refutes its rate), or None where it does not count."""
        due = self._due
        while due and due[0][0] <= now:
            _, model = heappop(due)
            cur = current(model)
            if cur is None:
                self._watched.discard(model)
                continue
            last, s0 = cur
            v = verdict_at(last, s0)
            if v > now:
                heappush(due, (v, model))
                continue
            self._watched.discard(model)
            if self._counted.get(model) != last:
                self._counted[model] = last
                self._add(v, 1)
        returned = stopped = 0.0
        hour = int(now // HOUR_S)
        self._drop_before(hour - KEEP_HOURS)
        for h, (r, s) in self._hours.items():
            w = math.exp(-max(0.0, now - (h + 0.5) * HOUR_S) / DECAY_S)
            returned += r * w
            stopped += s * w
        self.returned, self.stopped = returned, stopped
        self.reads += 1
        if self.stops_outweigh():
            self.refuting += 1
            return True
        return False

    def stops_outweigh(self) -> bool:
        """As of the last stop() call (a record with no verdict yet keeps the rate)."""
        return self.stopped > self.returned + PRIOR_RETURNS

    def describe(self) -> dict[str, float]:
        """For a replay's results: the share of plan calls that refuted, and the decayed record at the end."""
        return {"refuting_share": round(self.refuting / self.reads, 3) if self.reads else 0.0,
                "stops": round(self.stopped, 2), "pauses": round(self.returned, 2)}

    def why(self) -> str:
        """For the console and the leader's status: which reading of a silent model's rate the record chose."""
        head = ("silent models are valued by their idle-time model once their rate is refuted" if
                self.stops_outweigh() else "silent models keep their measured rate")
        return (f"{head}: of the silences that refuted a model's rate lately, {self.stopped:.1f} went on (stops) and "
                f"{self.returned:.1f} ended within as long again (pauses), decayed over {DECAY_S / 3600.0:.0f} h")
