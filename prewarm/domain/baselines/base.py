"""The one interface every baseline's decision rule implements, and what a rule may ask of the fleet.

A rule reacts to events — a request, a miss (a request with no replica of its model), a replica turning
ready, its own timers, a periodic tick — and acts through a `Fleet`: place a load (evicting in the rule's
own order), evict a ready replica, arm a timer. Two fleets implement it: the simulator's engine
(`simulator.engine.Simulation`, a virtual clock, events at their exact times) and the live scheduler's
(`baselines.live.SnapshotFleet`: each tick's snapshot, the actions turned into Preload/Evict for dispatch).
Models and GPUs are small integers (indexes) on both sides, so a rule's state can live in lists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol


class ReplicaLike(Protocol):
    model: int
    gpu: int
    bytes: int
    since: float  # load start
    state: str  # a states.py name: PENDING, LOADING or READY (live also WARMING, EVICTING)
    last_request: float | None


class Fleet(Protocol):
    n_models: int
    sizes: Sequence[int]  # bytes per model
    load_s: Sequence[float]  # load time per model (seconds, alone on its GPU)
    replicas: Sequence[Mapping[int, Any]]  # model -> gpu -> its replica (a ReplicaLike)
    stalled: Mapping[int, Any]  # models whose requests wait with no load (in arrival order)
    last_arrival: Sequence[float | None]  # model -> when its latest request arrived (None: none yet)

    def place_evicting(self, m: int, key: Callable[[Any], float], only_if: Callable[[Any], bool] | None = None,
                       kind: str = "") -> Any: ...
    # the replicas the last place_evicting evicted (empty when it found room or placed nothing)
    victims: Sequence[Any]

    def evict(self, m: int, gi: int) -> bool: ...

    def timer(self, t: float, payload: tuple) -> None: ...

    def resident_keys(self) -> set[tuple[int, int]]: ...


class Rule:
    """The do-nothing base of every baseline: one hook per event. `tick_s`: how often on_tick runs (None:
    never)."""

    name = "base"
    tick_s: float | None = None

    def attach(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def on_request(self, t: float, m: int, warm: bool) -> None:
        pass

    def on_miss(self, t: float, m: int) -> None:
        pass

    # True for a rule whose on_miss only places by `place_evicting` with no `only_if`: such a miss fails only
    # when no GPU's free and ready bytes reach the model's size, and then every larger model's fails too (a
    # placement in between only takes room), so on_stalled tries none of them (the same placements, without
    # the GPU scans that could not succeed: on a saturated fleet most of a baseline's time)
    monotone_misses = False
    # True for a rule whose eviction key never decreases while a replica is ready: its fleet may keep
    # `placement.VictimHeaps` (the same victims, without keying every resident at each miss)
    monotone_keys = False

    def on_stalled(self, t: float, models: list[int]) -> None:
        fleet = self.fleet
        failed: int | None = None  # the smallest size that found no room in this round
        for m in models:
            if m in fleet.stalled and not fleet.replicas[m]:
                if failed is not None and fleet.sizes[m] >= failed:
                    continue
                self.on_miss(t, m)
                if self.monotone_misses and not fleet.replicas[m]:
                    failed = fleet.sizes[m] if failed is None else min(failed, fleet.sizes[m])

    def on_ready(self, t: float, r: Any) -> None:
        pass

    def on_load_start(self, t: float, r: Any) -> None:
        pass  # a queued (PENDING) load got a load slot

    def on_staged(self, t: float, c: Any) -> None:
        pass

    def on_tick(self, t: float) -> None:
        pass

    def on_timer(self, t: float, payload: tuple) -> None:
        pass


def recency(fleet: Fleet, r: ReplicaLike) -> float:
    """LRU's key, the conventional one: a use is a request's arrival. A replica that has served a request
    is as recent as its model's latest request's arrival: a request that waited for the load counts from
    when it arrived, not from when the load finished (by completion, a load that queued long looked newer
    than models asked for while it queued). A replica that never served one (a load ahead of demand)
    counts from its load start. Victims are ready replicas only (`placement.choose`)."""
    if r.last_request is None:
        return r.since
    arrived = fleet.last_arrival[r.model]
    return r.last_request if arrived is None else arrived  # None: no arrival seen (a live restart)
