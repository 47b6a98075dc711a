"""Where a baseline's load goes on a fleet of several GPUs (the papers describe one memory pool).

On a GPU with room, as the live route hook picks one: a GPU with a free load slot first, then the most
free memory; else on the GPU whose victims, taken in ascending `key(replica)` order until the model fits,
have the smallest largest key (the closest to evicting in one global order; ties: a free slot first, then
most free memory). Only ready replicas are victims; `only_if(replica)` limits them further.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol


class GpuLike(Protocol):
    index: int
    capacity: int
    residents: Mapping[int, Any]  # model -> replica


def choose(gpus: Iterable[GpuLike], m: int, size: int, key: Callable[[Any], float],
           only_if: Callable[[Any], bool] | None, free: Callable[[int], int],
           busy: Callable[[int], bool]) -> tuple[int, list[Any]] | None:
    """(GPU index, victims in eviction order) for one load of model m, or None when no GPU can take it.
    `free(i)`: bytes a new load can have on GPU i; `busy(i)`: its load slots are all taken."""
    best: tuple | None = None
    for g in gpus:
        if g.capacity < size or m in g.residents:
            continue
        room = free(g.index)
        slots_busy = busy(g.index)
        if room >= size:
            cand = (0, 0.0, slots_busy, -room, g.index, [])
        else:
            victims = []
            freed = 0
            worst = -math.inf
            for r in sorted(
                (r for r in g.residents.values() if r.state == "ready" and (only_if is None or only_if(r))),
                key=lambda r: (key(r), r.model),
            ):
                victims.append(r)
                freed += r.bytes
                worst = max(worst, key(r))
                if room + freed >= size:
                    break
            if room + freed < size:
                continue
            cand = (1, worst, slots_busy, -room, g.index, victims)
        if best is None or cand[:5] < best[:5]:
            best = cand
    if best is None:
        return None
    return best[4], best[5]
