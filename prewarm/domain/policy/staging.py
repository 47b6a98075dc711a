"""The staging tier's step: which models to keep in a node's host memory (a later load there is a
promotion, not a storage read), and which staged models make room for them."""

from __future__ import annotations

import math
from collections.abc import Iterable

from prewarm.domain.action_kinds import DEMOTE, LIKELY, MAKE_ROOM
from prewarm.domain.states import IN_FLIGHT, STAGED

from .plan_call import PlanCall
from .types import GIB, StagedState
from .value import load_seconds, promote_seconds
from .words import fmt_s, num

MAX_STAGE_TRIES = 16  # per tick, best first


def host_victim_list(pl: PlanCall, node: str) -> list[tuple[float, str, StagedState]]:
    """Staged models on a node that could make room, lowest value per byte first."""
    v = pl.fleet.host_victims.get(node)
    if v is None:
        f = pl.fleet
        v = []
        for m, x in f.on_host[node].items():
            if x is None or x.state != STAGED or (m, node) in f.unstaging:
                continue
            if any(f.gpus[g].node == node and f.on_gpu[g].get(m) is not None
                   and f.on_gpu[g][m].state in IN_FLIGHT for g in f.of_model.get(m, ())):
                continue  # a promotion may be reading it right now
            vpb = pl.loss(m) / max(x.bytes / GIB, 1e-3) if m in pl.s.models else 0.0
            v.append((vpb, m, x))
        v.sort()
        pl.fleet.host_victims[node] = v
    return v


def step_stage(pl: PlanCall, candidates: Iterable[str]) -> None:
    """Keep models whose demand is likely but not imminent in a node's host memory: a later load
    there is a promotion (host → device), not a storage read. Candidates are models just evicted
    from their GPUs and models in a hot segment that got no GPU this tick; the cache keeps the
    highest expected value per byte, replacing staged models worth `stage_margin` times less."""
    f = pl.fleet
    cfg = pl.cfg
    if not f.nodes:
        return
    cands = []
    for m in set(candidates):
        spec = pl.s.models.get(m)
        if spec is None or f.count(m) > 0 or any(m in f.on_host[n] for n in f.nodes):
            continue
        v = pl.loss(m)
        if v > 0.0:
            cands.append((-v / max(spec.size_bytes / GIB, 1e-3), m, v))
    cands.sort()
    for negvpb, m, v in cands[:MAX_STAGE_TRIES]:
        spec = pl.s.models[m]
        vpb = -negvpb
        best: tuple | None = None
        for node in sorted(f.nodes):
            if f.stages_in_flight[node] >= cfg.max_stages_per_node:
                continue
            if f.nodes[node].budget_bytes < spec.size_bytes:
                continue
            free = f.host_avail(node)
            victims: list[tuple[float, str, StagedState]] = []
            if free < spec.size_bytes:
                freed = 0
                for e in host_victim_list(pl, node):
                    if e[0] * cfg.stage_margin >= vpb:
                        break  # what is there is worth keeping
                    victims.append(e)
                    freed += e[2].bytes
                    if free + freed >= spec.size_bytes:
                        break
                if free + freed < spec.size_bytes:
                    continue
            key = (bool(victims), max((e[0] for e in victims), default=0.0), -free, node)
            if best is None or key < best[0]:
                best = (key, node, victims)
        if best is None:
            continue
        _key, node, victims = best
        for evpb, _em, ex in victims:
            pl.do_unstage(ex, MAKE_ROOM,
                            f"make room in {node}'s host cache for {m}: lowest value per byte here "
                            f"({evpb:.3g} vs {vpb:.3g} cold req/s per GiB), {ex.bytes / GIB:.1f} GiB",
                            {"value_per_gib": evpb, "gib": ex.bytes / GIB})
        d = pl.idle(m)
        am = pl.arrival(m)
        mrl = am.mrl_at(d) if d is not None else math.inf
        kind = DEMOTE if m in pl.evicted_now else LIKELY
        pl.do_stage(
            spec, node, kind,
            f"{'evicted from its GPUs' if kind == DEMOTE else 'likely soon, no GPU free'}; "
            f"idle {fmt_s(d)}, next request expected in {fmt_s(mrl)}, {v:.3g} cold req/s if absent; "
            f"a promotion from host takes ~{promote_seconds(spec, cfg):.1f} s instead of "
            f"{load_seconds(spec, cfg):.1f} s → stage in {node}'s host cache",
            {"idle_s": num(d), "expected_next_s": num(mrl), "loss_per_s": v,
             "promote_s": promote_seconds(spec, cfg), "load_s": load_seconds(spec, cfg)},
            v,
        )

