"""The garbage collector of a process that holds many long-lived records: the scheduler (Heap) and a
trace replay (replay_gc).

A leading scheduler holds every model's traffic history, specs and parsed replica records (at 10,000
models, millions of objects) and allocates a few hundred thousand short-lived ones per tick. CPython's
collector, left as it is, now and then walks all of them in one pass (~125 ms at 10,000 models, measured
with `prewarm bench tick`), inside whatever tick it lands in. Once a reader's first tick has built them,
`Heap.settle` collects what is garbage, freezes the rest out of every later pass (gc.freeze) and makes the
young-generation passes rarer. A new reader (a new lead, Redis lost and back) is settled again after its
first tick: the old frozen objects are unfrozen first, so they are collected like any others.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator

# Net allocations of tracked objects between young-generation passes (CPython's default: 700).
YOUNG_PASS_ALLOCATIONS = 50_000


class Heap:
    def __init__(self) -> None:
        self._settled_for: weakref.ref[object] | None = None
        self.settles = 0

    def settle(self, owner: object | None) -> bool:
        """After a tick: if `owner` (the tick's snapshot reader, which holds the long-lived records) is not the
        one settled last, collect, freeze and make young passes rarer; True when it did."""
        if owner is None or (self._settled_for is not None and self._settled_for() is owner):
            return False
        gc.unfreeze()  # the last reader's records (if any still live) go back to being collected
        _settle()
        self._settled_for = weakref.ref(owner)
        self.settles += 1
        return True


@contextlib.contextmanager
def replay_gc() -> Iterator[None]:
    """A trace replay (simulator.run) with the collector settled as the scheduler's: what exists before it
    (the trace, the simulator) frozen, young passes rarer; as it was afterwards. The 1,350-model day's first
    8 h spent 1.1 s of 27 s in the collector before, under 0.2 s after, with the same decisions."""
    before = gc.get_threshold()
    ours = gc.get_freeze_count() == 0  # a caller that froze objects itself keeps them frozen, as it had them
    if ours:
        _settle()
    else:
        gc.set_threshold(YOUNG_PASS_ALLOCATIONS, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if ours:
            gc.unfreeze()


def _settle() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_PASS_ALLOCATIONS, *gc.get_threshold()[1:])
