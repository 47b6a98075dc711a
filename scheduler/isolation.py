"""One bad model never stops the plan for the others (issue 24, finding 2.5).

plan() is pure and the simulator runs it as it is; the fault isolation is the live scheduler's. When the
policy raises on a tick's snapshot, `Isolation.isolate` finds the model at fault by planning halves of the
snapshot's models, each with a fresh policy (a bisection: about two plans of the whole catalog in all, paid
once per fault, nothing on a tick that plans), leaves that model out, and plans the rest: the tick's actions.
The snapshot without a model is what the snapshot reader gives for a model not in the catalog (no spec, and
none of its replicas, staged copies, intents or waiting requests).

A model left out stays out, tick after tick, until its spec changes (a catalog edit, a new load-time median)
or goes away, or the scheduler's term ends; then it is planned again. A fault that no one model explains is
not isolated, and nothing is left out for it: the tick fails as before. That is a fault needing models of both
halves, or one that leaving out MAX_FAULTS models does not cure, e.g. a config every model's plan divides
by; the search is not run again until the snapshot's models mapping changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from prewarm.domain.baselines.live import Arrival
from prewarm.domain.choice import Policy
from prewarm.domain.policy import Action, ModelSpec, Snapshot

MAX_FAULTS = 4  # models left out in one tick before it gives up (each costs about two plans)


@dataclass(frozen=True)
class LeftOut:
    spec: ModelSpec  # the spec that failed: the model is planned again once its spec is another
    reason: str  # what the policy raised, "ValueError: cannot convert float NaN to integer"


def without(snap: Snapshot, drop: Collection[str], models: Mapping[str, ModelSpec] | None = None) -> Snapshot:
    """`snap` as if the models in `drop` were not in the catalog. `models`: the filtered mapping, when the
    caller keeps one (the policy's memo carries its timeline on only while the mapping is the same object)."""
    if models is None:
        models = {k: v for k, v in snap.models.items() if k not in drop}
    return dataclasses.replace(
        snap, models=models,
        replicas=tuple(r for r in snap.replicas if r.model not in drop),
        intents=tuple(it for it in snap.intents if it.model not in drop),
        staged=tuple(x for x in snap.staged if x.model not in drop),
        recent_evictions={k: v for k, v in snap.recent_evictions.items() if k not in drop},
        waiting={k: v for k, v in snap.waiting.items() if k not in drop},
        waiting_since={k: v for k, v in snap.waiting_since.items() if k not in drop})


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _raises(policy: Policy, snap: Snapshot, now: float, arrivals: Sequence[Arrival]) -> Exception | None:
    try:
        policy.decide(snap, now, arrivals)
    except Exception as exc:  # what the tick would have died of
        return exc
    return None


def culprit(fails: Callable[[list[str]], Exception | None], models: list[str]) -> tuple[str, Exception] | None:
    """The model whose plan fails on its own, found by halving `models` (`fails(group)`: the exception a plan
    of only `group` raises, None when it plans); None when no half fails alone."""
    err: Exception | None = None
    while len(models) > 1:
        half = len(models) // 2
        for part in (models[:half], models[half:]):
            err = fails(part)
            if err is not None:
                models = part
                break
        else:
            return None  # the fault needs models of both halves: not one model's
    if err is None and models:
        err = fails(models)
    return (models[0], err) if err is not None else None


class Isolation:
    """The models left out of the live plan (one term's; the scheduler makes a new one with each lead)."""

    def __init__(self) -> None:
        self.left_out: dict[str, LeftOut] = {}
        # (the reader's models mapping, the left-out keys, the mapping without them): the same filtered
        # object tick after tick while neither changes
        self._view: tuple[Mapping[str, ModelSpec], frozenset[str], dict[str, ModelSpec]] | None = None
        self._gave_up: Mapping[str, ModelSpec] | None = None  # the models mapping no search could cure

    def view(self, snap: Snapshot) -> tuple[Snapshot, list[str]]:
        """The snapshot to plan: without the models left out. Also the models let back in (their spec
        changed, or they left the catalog): the caller plans with a fresh policy then."""
        back = [m for m, x in self.left_out.items() if snap.models.get(m) is not x.spec
                and snap.models.get(m) != x.spec]
        for m in back:
            del self.left_out[m]
        if not self.left_out:
            self._view = None
            return snap, back
        keys = frozenset(self.left_out)
        if self._view is None or self._view[0] is not snap.models or self._view[1] != keys:
            self._view = (snap.models, keys, {k: v for k, v in snap.models.items() if k not in keys})
        return without(snap, keys, self._view[2]), back

    def isolate(self, fresh: Callable[[], Policy], snap: Snapshot, now: float, arrivals: Sequence[Arrival],
                error: Exception) -> tuple[Policy, list[Action], dict[str, str]]:
        """The policy raised `error` on `snap`: find the models at fault, leave them out, and plan the rest
        with a fresh policy (returned: the caller keeps it, as a failed call may have left the old one's
        cache half updated). Also the models newly left out, each with what it raised. Re-raises `error`,
        leaving nothing out, when the fault is not one model's (see the module's docstring)."""
        if snap.models is self._gave_up:
            raise error
        names = sorted(snap.models)

        def fails(group: list[str]) -> Exception | None:
            keep = set(group)
            return _raises(fresh(), without(snap, [m for m in names if m not in keep]), now, arrivals)

        found: dict[str, str] = {}
        for _ in range(MAX_FAULTS):
            hit = culprit(fails, [m for m in names if m not in found and m not in self.left_out])
            if hit is None:
                break
            model, exc = hit
            found[model] = _describe(exc)
            self.left_out[model] = LeftOut(snap.models[model], found[model])
            policy = fresh()
            try:  # the view later ticks plan, so the policy's cache carries on from this one
                return policy, policy.decide(self.view(snap)[0], now, arrivals), found
            except Exception:  # another model at fault too: look again without this one
                continue
        for model in found:  # not cured: leave nothing out for it
            del self.left_out[model]
        self._view = None
        self._gave_up = snap.models
        raise error
