"""Where a baseline's load goes on a fleet of several GPUs (the papers describe one memory pool).

On a GPU with room: the first of the one placement rule, `prewarm.domain.policy.placement.rank` (the rule
prewarm's planner, the route hook and the operator use: a free load slot first, the fewest loads on its
link, then the tightest fit). Else the baseline's own strategy, its eviction order `key`: the GPU whose
victims, taken in ascending `key(replica)` order until the model fits, have the smallest largest key (the
closest to evicting in one global order; ties: a free slot first, then most free memory). Only ready
replicas are victims; `only_if(replica)` limits them further.

A rule whose keys never decrease while a replica is ready (`Rule.monotone_keys`: recency, load start,
greedy-dual's priority) lets a fleet keep `VictimHeaps`: per GPU a lazy min-heap of (key, model) whose entries are
lower bounds, corrected when popped, so a miss reads the few victims it takes instead of keying and sorting
every resident of every GPU (on a saturated fleet, most of a baseline's time). The same victims, in the same order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from prewarm.domain.states import READY

from ..policy.placement import Room, rank


class GpuLike(Protocol):
    index: int
    capacity: int
    residents: Mapping[int, Any]  # model -> replica


class VictimHeaps:
    """Per GPU, a lazy min-heap of (key, model) over its ready replicas, for a key that never decreases while a
    replica is ready. Invariant: every ready replica on GPU i has an entry in heaps[i] at most its current key.
    A replica enters at -inf when it turns ready (`ready`), so no key is needed then; an entry popped is checked
    against its GPU's residents: stale (gone, not ready, a duplicate) it is dropped, low it goes back at the
    current key, exact it is a victim in (key, model) order, the order `choose` sorts by."""

    def __init__(self, n_gpus: int) -> None:
        self.heaps: list[list[tuple[float, int]]] = [[] for _ in range(n_gpus)]

    def ready(self, r: Any) -> None:
        heapq.heappush(self.heaps[r.gpu], (-math.inf, r.model))

    def victims(self, g: GpuLike, key: Callable[[Any], float], need: int,
                bound: float) -> tuple[list[Any], int, float]:
        """Ready replicas of GPU g in ascending (key, model) order until their bytes reach `need`, or until the
        next key exceeds `bound` (this GPU cannot beat a choice already made): (victims, bytes, largest key)."""
        heap = self.heaps[g.index]
        residents = g.residents
        if len(heap) > 4 * len(residents) + 64:  # entries of evicted replicas pile up: start over
            heap[:] = [(-math.inf, mm) for mm, r in residents.items() if r.state == READY]
            heapq.heapify(heap)
        taken: list[tuple[float, int]] = []
        victims: list[Any] = []
        seen: set[int] = set()
        freed = 0
        worst = -math.inf
        while heap and freed < need:
            k, mm = heap[0]
            if k > bound:
                break
            heapq.heappop(heap)
            r = residents.get(mm)
            if r is None or r.state != READY or mm in seen:
                continue
            kc = key(r)
            if kc != k:
                if kc > k:
                    heapq.heappush(heap, (kc, mm))
                continue  # below: a stale entry (the replica's own one is lower, still in the heap)
            seen.add(mm)
            taken.append((k, mm))
            victims.append(r)
            freed += r.bytes
            worst = k
        for e in taken:  # a look, not an eviction: the fleet evicts what it chooses (and its entries go stale)
            heapq.heappush(heap, e)
        return victims, freed, worst


def choose(gpus: Iterable[GpuLike], m: int, size: int, key: Callable[[Any], float],
           only_if: Callable[[Any], bool] | None, free: Callable[[int], int],
           loads: Callable[[int], int], max_loads: int,
           heaps: VictimHeaps | None = None) -> tuple[int, list[Any]] | None:
    """(GPU index, victims in eviction order) for one load of model m, or None when no GPU can take it.
    `free(i)`: bytes a new load can have on GPU i; `loads(i)`: its loads running or queued; `max_loads`:
    its load slots (0: no limit). `heaps`: the fleet's victim heaps, for a monotone `key` and no `only_if`."""
    cands = [(g, free(g.index)) for g in gpus if g.capacity >= size and m not in g.residents]
    # Room ids sort as the indices do (rank breaks its last ties by id); only a GPU with room is one rank keeps
    rooms = [Room(f"{g.index:09d}", "", room, loads(g.index)) for g, room in cands if room >= size]
    fits = rank(rooms, size, max_loads=max_loads)
    if fits:
        return int(fits[0].gpu), []
    best: tuple | None = None
    if heaps is not None and only_if is None:
        for g, room in cands:
            victims, freed, worst = heaps.victims(g, key, size - room, math.inf if best is None else best[0])
            if room + freed < size:
                continue
            cand = (worst, 0 < max_loads <= loads(g.index), -room, g.index, victims)
            if best is None or cand[:4] < best[:4]:
                best = cand
        return None if best is None else (best[3], best[4])
    for g, room in cands:
        victims = []
        freed = 0
        worst = -math.inf
        # each key read once; (key, model) is unique on a GPU, so the replica itself is never compared
        ordered = [(key(r), r.model, r) for r in g.residents.values()
                   if r.state == READY and (only_if is None or only_if(r))]
        ordered.sort()
        for k, _m, r in ordered:
            victims.append(r)
            freed += r.bytes
            worst = max(worst, k)
            if room + freed >= size:
                break
        if room + freed < size:
            continue
        cand = (worst, 0 < max_loads <= loads(g.index), -room, g.index, victims)
        if best is None or cand[:4] < best[:4]:
            best = cand
    if best is None:
        return None
    return best[3], best[4]
