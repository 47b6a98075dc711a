"""Where a baseline's load goes on a fleet of several GPUs (the papers describe one memory pool).

On a GPU with room: the first of the one placement rule, `prewarm.domain.policy.placement.rank` (the rule
prewarm's planner, the route hook and the operator use: a free load slot first, the fewest loads on its
link, then the tightest fit). Else the baseline's own strategy, its eviction order `key`: the GPU whose
victims, taken in ascending `key(replica)` order until the model fits, have the smallest largest key (the
closest to evicting in one global order; ties: a free slot first, then most free memory). Only ready
replicas are victims; `only_if(replica)` limits them further.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from prewarm.domain.states import READY

from ..policy.placement import Room, rank


class GpuLike(Protocol):
    index: int
    capacity: int
    residents: Mapping[int, Any]  # model -> replica


def choose(gpus: Iterable[GpuLike], m: int, size: int, key: Callable[[Any], float],
           only_if: Callable[[Any], bool] | None, free: Callable[[int], int],
           loads: Callable[[int], int], max_loads: int) -> tuple[int, list[Any]] | None:
    """(GPU index, victims in eviction order) for one load of model m, or None when no GPU can take it.
    `free(i)`: bytes a new load can have on GPU i; `loads(i)`: its loads running or queued; `max_loads`:
    its load slots (0: no limit)."""
    cands = [(g, free(g.index)) for g in gpus if g.capacity >= size and m not in g.residents]
    # Room ids sort as the indices do (rank breaks its last ties by id); only a GPU with room is one rank keeps
    rooms = [Room(f"{g.index:09d}", "", room, loads(g.index)) for g, room in cands if room >= size]
    fits = rank(rooms, size, max_loads=max_loads)
    if fits:
        return int(fits[0].gpu), []
    best: tuple | None = None
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
