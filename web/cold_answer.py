"""What the route hook adds to a `loading` or `cold` answer, so a router has something to act on:
`eta_seconds` (prewarm.eta) with a `Retry-After` header, the promise recorded for the ETA error metric
(prewarm.store.eta_promises), and the catalog fallback's ready replicas (`fallback`); and the per-minute
count of every lookup that is a request (prewarm.store.lookup_counts: the SLO's window, /api/roi).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prewarm import eta, replica_states, state
from prewarm.catalog import ModelEntry
from prewarm.store import eta_promises, lookup_counts
from web import metrics
from web.util import ctx


def add_fields(body: dict[str, Any], entry: ModelEntry, fleet: state.Fleet, counted: bool,
               replica_view: Callable[[state.Replica, state.Gpu], dict[str, Any]]) -> dict[str, str]:
    """Add eta_seconds (and fallback, when the catalog names one) to a loading/cold `body`; returns the
    headers to send. `counted`: this lookup is a request, not a router's retry poll."""
    c = ctx()
    now = time.time()
    # With no load placed (no room yet), the scheduler makes room at its wake-up: about one tick more.
    seconds = eta.model_eta(c.r, c.catalog, fleet, entry.id, entry.version, c.settings.max_loads_per_gpu,
                            now, c.settings.tick_seconds)
    body["eta_seconds"] = round(seconds, 2)
    eta_promises.promise(c.r, entry.id, entry.version, seconds, now)
    fb = fallback_answer(entry, fleet, replica_view)
    if fb is not None:
        body["fallback"] = fb
        if counted and fb["replicas"]:
            metrics.FALLBACK_OFFERS.labels(entry.id, fb["model"]).inc()
    return {"Retry-After": eta.retry_after(seconds)}


def fallback_answer(entry: ModelEntry, fleet: state.Fleet,
                    replica_view: Callable[[state.Replica, state.Gpu], dict[str, Any]]) -> dict[str, Any] | None:
    """The first model along the entry's fallback chain with a ready replica, with those replicas (least
    busy first); the direct fallback with none when nothing along the chain is ready; None: no fallback."""
    catalog = ctx().catalog
    first: dict[str, Any] | None = None
    name = entry.fallback
    while name is not None and name in catalog:  # the catalog refuses cycles and unknown names
        fb = catalog.get(name)
        ready = sorted(((x, g) for g in fleet.alive() for x in g.replicas
                        if x.model == fb.id and x.version == fb.version and x.state == replica_states.READY),
                       key=lambda p: (p[0].in_flight, p[1].id))
        answer = {"model": fb.id, "version": fb.version, "replicas": [replica_view(x, g) for x, g in ready]}
        if ready:
            return answer
        first = first or answer
        name = fb.fallback
    return first


def count_lookup(body: dict[str, Any]) -> None:
    """Count a lookup that is a request in its minute: ready on the replica named first, or not ready."""
    first = body["replicas"][0] if body["state"] == "ready" else None
    ready_on = (body["model"], first["version"], first["gpu"]) if first else None
    lookup_counts.count_lookup(ctx().r, body["model"], ready_on, time.time())
