"""The scheduler process's garbage collector, settled once a tick has built its records.

A leading scheduler holds every model's traffic history, specs and parsed replica records (at 10,000
models, millions of objects) and allocates a few hundred thousand short-lived ones per tick. CPython's
collector, left as it is, now and then walks all of them in one pass (~125 ms at 10,000 models, measured
with `prewarm bench tick`), inside whatever tick it lands in. Once a reader's first tick has built them,
`Heap.settle` collects what is garbage, freezes the rest out of every later pass (gc.freeze) and makes the
young-generation passes rarer. A new reader (a new lead, Redis lost and back) is settled again after its
first tick: the old frozen objects are unfrozen first, so they are collected like any others.
"""

from __future__ import annotations

import gc
import weakref

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
        gc.collect()
        gc.freeze()
        gc.set_threshold(YOUNG_PASS_ALLOCATIONS, *gc.get_threshold()[1:])
        self._settled_for = weakref.ref(owner)
        self.settles += 1
        return True
