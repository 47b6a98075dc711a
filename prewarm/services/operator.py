"""Operator actions — preload and evict a model — as one use case behind the API, the console and the CLI.

Each caller parses its own input and renders the answer its own way (JSON, a flash message, a line on stdout);
what is refused, with which words, and how the dispatched action is marked (`actor="operator"`,
`kind="operator"`, so `prewarm_evictions_total{reason="operator"}` counts a CLI evict as it counts the
console's) is decided here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from prewarm import rooms, state
from prewarm.catalog_entries import ModelEntry
from prewarm.dispatch import Dispatched
from prewarm.domain.action_kinds import OPERATOR
from prewarm.domain.states import READY

Field = Literal["model", "version", "gpu"]


class Refused(Exception):
    """An operator action not taken. `field`: the input at fault; `conflict`: the request was well-formed but
    the fleet's state refuses it now (HTTP 409), otherwise the input names something that does not exist (404
    for an unknown model, else 422)."""

    def __init__(self, message: str, field: Field, *, conflict: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.conflict = conflict

    @property
    def status(self) -> int:
        if self.conflict:
            return 409
        return 404 if self.field == "model" else 422


@dataclass(frozen=True)
class Evicted:
    gpu: state.Gpu
    sent: Dispatched


def entry(ctx: Any, model: str, version: str | None) -> ModelEntry:
    """The catalog entry an action names; Refused says which part is unknown."""
    catalog = ctx.catalog
    if model not in catalog:
        raise Refused(f"model: unknown model {model!r}: `prewarm models list` shows the catalog", "model")
    try:
        return catalog.get(model, version)
    except KeyError:
        raise Refused(f"version: unknown version {version!r} of {model!r}", "version") from None


def preload(ctx: Any, e: ModelEntry, gpu: str | None, reason: str) -> Dispatched:
    """Queue a preload of `e` on the GPU named (id or device) or the placement rule's choice."""
    fleet = state.read_fleet(ctx.r)
    try:
        target = rooms.pick_gpu(ctx.r, fleet, ctx.catalog, e, gpu, ctx.settings.max_loads_per_gpu)
    except LookupError as exc:
        raise Refused(f"gpu: {exc}", "gpu", conflict=not gpu) from None
    # Ready there: nothing to do. A load in flight is refused below by its intent, naming it; a failed record
    # must not block the retry.
    if any(x.model == e.id and x.version == e.version and x.state == READY for x in target.replicas):
        raise Refused(f"{e.key} is already on {target.id}", "gpu", conflict=True)
    d = ctx.dispatcher.preload(e.id, e.version, target, actor="operator", kind=OPERATOR, reason=reason,
                               priority=e.priority)
    if not d.sent:
        raise Refused(d.message, "gpu", conflict=True)
    return d


def evict(ctx: Any, e: ModelEntry, gpu: str | None, reason: str) -> list[Evicted]:
    """Queue an evict of `e` from every GPU that holds it or is loading it (or only `gpu`, by id or device).
    Every target is tried; the caller reports those not sent (another action on them in flight)."""
    fleet = state.read_fleet(ctx.r)
    if gpu and not any(gpu in (g.id, g.device) for g in fleet.gpus):
        raise Refused(f"gpu: GPU {gpu!r} is not in the fleet", "gpu")
    targets = rooms.evict_targets(ctx.r, [g for g in fleet.alive() if gpu in (None, g.id, g.device)], e.id,
                                  e.version)
    if not targets:
        where = f" on {gpu}" if gpu else ""
        raise Refused(f"{e.key} is not resident{where}: nothing to evict", "model", conflict=True)
    return [Evicted(g, ctx.dispatcher.evict(e.id, e.version, g, actor="operator", kind=OPERATOR, reason=reason))
            for g in targets]
