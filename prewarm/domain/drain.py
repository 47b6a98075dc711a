"""Which replicas of a draining node need a home elsewhere before the node's replicas are evicted.

A model still has demand when it is pinned, has a `min_replicas` floor, or saw traffic in the last window;
it then wants max(min_replicas, 1) ready replicas off the draining nodes. Each of its replicas on a
draining node that the replicas ready elsewhere do not make up for needs a home: a replacement is loaded
first (make-before-break, as the `max_replica_age` refresh replaces an old replica), and the node's
replica is evicted only once none of its replicas needs one. Loads in flight elsewhere count as homes
coming (nobody sends a second), not as homes (nobody evicts on their strength).

Pure: no I/O, no clock (prewarm.services.drain reads the fleet and the traffic and acts on the answer).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Demand:
    """What keeps a model wanted, by the catalog, the operator's pins and the traffic."""

    pinned: bool = False
    min_replicas: int = 0
    recent_traffic: bool = False  # a request came in the last window

    @property
    def wanted(self) -> int:
        """Ready replicas the model should keep off the draining nodes (0: none, it may go cold)."""
        floor = 1 if self.pinned or self.recent_traffic else 0
        return max(self.min_replicas, floor)

    def why(self) -> str:
        parts = []
        if self.pinned:
            parts.append("pinned")
        if self.min_replicas:
            parts.append(f"min_replicas {self.min_replicas}")
        if self.recent_traffic:
            parts.append("traffic in the last window")
        return ", ".join(parts) or "no demand"


@dataclass(frozen=True)
class Held:
    """A replica (ready or on its way in) on a GPU of a draining node."""

    model: str
    version: str
    gpu: str


@dataclass(frozen=True)
class Need:
    """Replicas of model@version on draining nodes that need a home: `homeless` of them are not made up
    for by replicas ready elsewhere; `to_load` of those have no load in flight elsewhere either."""

    model: str
    version: str
    wanted: int
    ready_elsewhere: int
    loading_elsewhere: int
    homeless: int
    to_load: int
    why: str
    gpus: tuple[str, ...]  # the draining GPUs that hold it


def needs(held: Iterable[Held], demand: Mapping[str, Demand], ready_elsewhere: Mapping[tuple[str, str], int],
          loading_elsewhere: Mapping[tuple[str, str], int]) -> list[Need]:
    """One Need per model@version held on the draining nodes whose demand wants more ready replicas than are
    ready elsewhere, sorted by model; `ready_elsewhere` / `loading_elsewhere`: replicas per (model, version)
    ready / loading (or a preload dispatched) on GPUs that are not draining."""
    by_key: dict[tuple[str, str], list[str]] = {}
    for h in held:
        by_key.setdefault((h.model, h.version), []).append(h.gpu)
    out = []
    for (model, version), gpus in sorted(by_key.items()):
        d = demand.get(model, Demand())
        ready = ready_elsewhere.get((model, version), 0)
        homeless = min(len(gpus), max(0, d.wanted - ready))
        if homeless == 0:
            continue
        loading = loading_elsewhere.get((model, version), 0)
        out.append(Need(model, version, d.wanted, ready, loading, homeless, max(0, homeless - loading), d.why(),
                        tuple(sorted(gpus))))
    return out
