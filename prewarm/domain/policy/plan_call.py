"""One plan() call's working state: its Values and tentative Fleet, and the actions chosen so far
(each recorded with the fleet's tentative change)."""

from __future__ import annotations

import math

from prewarm.domain.action_kinds import DEMAND, MAKE_ROOM, SPECULATIVE, YIELD

from .memo import PolicyState
from .placement import place
from .types import (
    GIB,
    Action,
    Evict,
    ModelSpec,
    Placement,
    Preload,
    ReplicaState,
    Snapshot,
    Stage,
    StagedState,
    Unstage,
)
from .value import Values, promote_seconds
from .words import fmt_s, num


class PlanCall(Values):
    def __init__(self, snap: Snapshot, now: float, state: PolicyState) -> None:
        super().__init__(snap, now, state)
        self.actions: list[Action] = []
        self.evicted_now: list[str] = []  # models this call evicts: candidates to keep in host memory

    def do_evict(self, r: ReplicaState, kind: str, reason: str, numbers: dict[str, float]) -> None:
        self.fleet.evict(r, self.is_speculative(r))
        if self.fleet.count(r.model) == 0:
            self.st.ahead.gone(r.model)  # a load ahead evicted unused can no longer win its bet (ahead.py)
            # before its first request (firsts.py); not a yield: that cancel says a demand load needed the link,
            # nothing of whether the fill's memory was worth it (an empty fleet's first seconds yield a fill per GPU)
            if kind != YIELD and self.tr.last_arrival(r.model) is None:
                self.st.firsts.fill_evicted()
        if self.cfg.no_regret:  # greedy-dual's clock and frequencies follow the real fleet (experts.py)
            self.st.experts.gd.evicted(r.model, self.fleet.count(r.model) == 0)
        self.evicted_now.append(r.model)
        self.actions.append(Evict(r.model, r.gpu, kind, reason, numbers, r.version))

    def yield_link(self, gpu: str, model: str) -> None:
        """Cancel the fills loading on `gpu` (Values.yielding): a demand load for `model` goes there. Sharing the
        link would halve its bandwidth while its requests wait (Azure 500 × 16, the empty fleet's first
        seconds: the busiest model's 1.6 s load shared a link with a fill and 228 requests came cold in 10 s,
        against 119 for FaasCache); a fill's guess costs a cancelled load only the link time it had. The worker
        cancels a load in flight on an evict; the model is then on record as evicted, so the fill does not
        take it again at once."""
        for r in self.yielding(gpu):
            # never requested, so greedy-dual holds no keys for it: do_evict's step there changes nothing
            self.do_evict(r, YIELD, f"{r.model} (never requested) was loading on {gpu}; a demand load of {model} "
                          f"goes there: it gives way, so that the link is the demand load's alone", {})

    def do_preload(self, spec: ModelSpec, gpu: str, kind: str, reason: str, numbers: dict[str, float]) -> None:
        self.fleet.preload(spec, gpu, kind == SPECULATIVE)
        self._loading_rate[gpu] = self.loading_rate(gpu) + max(self.tr.rate_short(spec.id, self.now), 1e-3)
        self.actions.append(Preload(spec.id, gpu, kind, reason, numbers, spec.version, spec.size_bytes))

    def place(self, spec: ModelSpec, kind: str, benefit: float = math.inf) -> Placement | None:
        return place(self, spec, kind, benefit)

    def load(self, spec: ModelSpec, kind: str, reason: str, numbers: dict[str, float],
             benefit: float = math.inf) -> bool:
        choice = self.place(spec, kind, benefit)
        if choice is None:
            return False
        self.commit(spec, kind, choice, reason, numbers)
        return True

    def commit(self, spec: ModelSpec, kind: str, choice: Placement, reason: str,
               numbers: dict[str, float]) -> None:
        """Record place()'s choice: its evictions, then the preload."""
        gid, victims, _loss = choice
        lead = ""
        order = "lowest value per byte here"
        extra: dict[str, float] = {}
        if victims and self.cfg.no_regret:
            ex = self.st.experts
            lead = f"; {ex.why()}, so its order ranks the victims"
            if ex.leader != "prewarm":
                order = f"first in {ex.leader}'s eviction order here"
            if ex.ghosts_fed:  # the ghosts' misses, where they judge or gate (experts.py)
                extra = {"expert_leader_misses": ex.lead_misses(), "expert_prewarm_misses": ex.misses("prewarm")}
            if self.cfg.expert_duels:  # what the leader's evictions cost per request, and whether on trial
                extra = {**extra, "expert_cost_per_request": ex.duels.per_request(),
                         "expert_on_trial": 1.0 if ex.duels.trial is not None else 0.0}
        # a load ahead (speculative; partners load so too) is judged by the loads-ahead record (ahead.py), not by duels
        if victims and self.cfg.no_regret and self.cfg.expert_duels and kind != SPECULATIVE:
            self._duel(gid, victims)
        for r in victims:
            d = self.idle(r.model)
            mrl = self.arrival(r.model).mrl_at(d) if d is not None and r.model in self.s.models else math.inf
            val = self.loss(r.model)
            refuted = self.refuted(r.model)
            self.do_evict(
                r, MAKE_ROOM,
                f"make room on {gid} for {spec.id} ({kind}): {order} — "
                f"idle {fmt_s(d)}, next request expected in {fmt_s(mrl)}, "
                f"{val:.3g} cold req/s if absent{' (its silence refuted its measured rate)' if refuted else ''}, "
                f"{r.bytes / GIB:.1f} GiB{lead}",
                {"idle_s": num(d), "expected_next_s": num(mrl), "loss_per_s": val,
                 "gib": r.bytes / GIB, **({"rate_refuted": 1.0} if refuted else {}), **extra},
            )
        if kind == DEMAND and self.cfg.fill_yields:
            self.yield_link(gid, spec.id)
        node = self.fleet.gpus[gid].node
        if node in self.fleet.staged_nodes.get(spec.id, ()):
            self.do_preload(spec, gid, kind,
                            f"{reason} → preload on {gid}, promoted from {node}'s host cache in "
                            f"~{promote_seconds(spec, self.cfg):.1f} s", {**numbers, "from_host": 1.0})
        else:
            self.do_preload(spec, gid, kind, f"{reason} → preload on {gid}", numbers)


    def _duel(self, gid: str, victims: list[ReplicaState]) -> None:
        """Open the duels of this eviction (duels.py): what each other expert's order would have taken here,
        as many bytes, from the same victims (loads ahead are judged by their own record, ahead.py)."""
        ex = self.st.experts
        taken = tuple(r.model for r in victims)
        ex.duels.took(taken, self.now)
        need = sum(r.bytes for r in victims)
        entries = self.victim_list(gid)
        for name in ex.names:
            if name == ex.duels.leader:
                continue
            mine = list(entries)
            self.sort_victims(name, mine)
            would: list[str] = []
            freed = 0
            for _vpb, m, r in mine:
                if freed >= need:
                    break
                if m in self.floors and not self.evictable(r):
                    continue
                would.append(m)
                freed += r.bytes
            ex.duels.open(name, taken, tuple(would), self.now)

    def do_stage(self, spec: ModelSpec, node: str, kind: str, reason: str, numbers: dict[str, float],
                 value: float) -> None:
        self.fleet.stage(spec, node)
        self.actions.append(Stage(spec.id, node, kind, reason, numbers, spec.version, spec.size_bytes, value))

    def do_unstage(self, x: StagedState, kind: str, reason: str, numbers: dict[str, float]) -> None:
        self.fleet.unstage(x)
        self.actions.append(Unstage(x.model, x.node, kind, reason, numbers, x.version))
