"""plan(): the warming policy. Pure: reads a Snapshot and `now`, returns actions; no I/O, no clock.

Order of work in one call (each step sees the tentative effect of the previous ones):
0. the no-regret layer (experts.py, duels.py; PolicyConfig.no_regret, on by default): the requests since
   the last call settle the duels between each real eviction and what the eviction orders of prewarm,
   greedy-dual, LRU and the forecast rule would have taken instead (whichever side is asked for first);
   the order whose record clears the margin leads on trial, kept only if its own evictions then cost
   less; the leader orders every eviction below;
1. idle-memory budget: a replica is never evicted for being quiet (the idle-time model says no
   request for a long while); it stays resident as the first victim of a load that needs its
   memory. Only over an explicit budget (PolicyConfig.idle_memory_budget: the share of a GPU that
   replicas with no expected demand may hold) are the least valuable of them evicted;
2. demand: a model with a request in the last demand_window_s and no replica → load it now,
   evicting the lowest expected value per byte if no GPU has room; every load goes to a GPU with
   fewer than max_loads_per_gpu loads in flight (loads sharing a link slow each other down, and
   every request waiting on them with it), so when all are busy it waits for the next tick, where
   the waiting model a second's delay costs most per second of its load is placed first (its request
   rate plus its waiting requests' seconds, HRRN-grown so none starves: steps.demand_weight);
3. keep pinned / min_replicas models at their floor;
4. scale: forecast each capped model's rate one load time ahead, add replicas on other nodes;
5. a GPU that just joined takes replicas of the hottest models;
5b. partners (partners.py): a model that starts (a request after partner_gap_s idle) is a sign
   for the models that started within partner_window_s of most of its earlier starts (pipelines,
   ensembles, one application's models): they are expected within the window (valued so by loss(),
   and not quiet) and, if absent, loaded ahead under the speculative rules below;
6. speculative: models in a "hot" segment of their idle-time timeline (a request is likely
   within their load time + a minute) are loaded ahead, within the speculative share of a GPU,
   evicting only residents worth `prefetch_margin` times less; loads ahead (5b and 6) are bets judged on
   the real fleet (ahead.py: their model asked for before their victims, their link time charged), held
   back while the record says they saved less than `prefetch_margin` times what they cost;
6b. refresh (refresh.py): a replica older than its model's max_replica_age is replaced
   make-before-break: a fresh replica loads where room and a link are free, then the old one goes;
7. fill: free memory takes catalog models not requested yet (all of it while fills pay on this traffic,
   else up to speculative_share of each GPU: firsts.py), what fits, one per idle link, shortest load first,
   while no request waits: a first request need not be cold. A fill is worth the measured rate of first
   requests (firsts.py), so it goes before every resident worth more and after the quiet ones worth less;
   one evicted unrequested is not filled again (steps.step_fill);
8. staging tier (only when the snapshot has host caches): models this call evicted and hot models
   that got no GPU are staged in a node's host memory, best value per byte first, replacing staged
   models worth `stage_margin` times less; a load of a staged model goes to its node (a promotion,
   `promote_seconds`, instead of a storage load), and a staged resident is the cheaper victim.

Value of a replica = expected cold requests per second its absence would cause
  = c × return rate, where
  c = 1 + requests arriving during a reload (requests per active minute × load time stretched by
      the fleet's current link contention) + requests its link time would hold up on other loads;
  return rate = 1 / E[time to next request | idle so far] from the idle-time model, or the
      10-minute measured rate if higher, or P(partner) / partner_window_s for an expected partner;
per byte when choosing victims. A GPU for a load is chosen by the fewest expected cold requests:
its victims' (capped at one reload each, over EVICTION_HORIZON_S or the catalog's median load, the
longer) plus link contention.
A request that arrived before the model's last eviction is not demand (it was served).

Where each part lives: memo (PolicyState, kept between calls), experts (the no-regret layer), timeline
(hot/cold segments), fleet (the tentative fleet), value (load times, loss(), victim order), partners (5b),
placement (a GPU for a load; a speculative load never evicts a higher-priority model's replica), plan_call
(one call's working state and actions), steps (1-7), refresh (6b), staging (8), words (reason text).
"""

from __future__ import annotations

from .memo import PolicyState
from .partners import expectations, step_partners
from .plan_call import PlanCall
from .refresh import step_refresh
from .staging import step_stage
from .steps import (
    step_demand,
    step_fill,
    step_floor,
    step_new_gpu,
    step_release,
    step_scale,
    step_speculative,
)
from .timeline import advance
from .types import GIB, Action, Snapshot
from .value import Values, load_seconds, promote_seconds

__all__ = ["PolicyState", "load_seconds", "plan", "promote_seconds"]


def plan(snapshot: Snapshot, now: float, state: PolicyState | None = None) -> list[Action]:
    """Decide the preloads and evictions for this tick. See the package docstring."""
    st = state if state is not None else PolicyState()
    pl = PlanCall(snapshot, now, st)
    pl.expect = expectations(pl)
    advance(pl)
    cfg = snapshot.config
    if cfg.no_regret:
        feed_experts(pl)
    if cfg.ahead_gate:
        st.ahead.feed(pl.tr, now, cfg.expert_halflife_s, pl.cost, cfg.prefetch_margin)
    # Only resident models can be released. A model not resident stays in the due set (until its cold
    # segment ends or its timeline moves): a replica of it that appears with no request of its own (a
    # floor, an operator's preload) is quiet at once, as a fresh state would see it.
    of_model, due, expect = pl.fleet.of_model, st.due, pl.expect
    # (the smaller of the two is walked: `quiet` is a set, only ever asked for membership)
    for m in (due if len(due) <= len(of_model) else of_model):
        if of_model.get(m) and m in due and m not in expect:  # an expected partner is not quiet
            pl.quiet.add(m)
    step_release(pl)
    step_demand(pl, sorted(set(st.recent) | set(snapshot.waiting)))
    step_floor(pl)
    step_scale(pl)
    step_new_gpu(pl)
    step_refresh(pl)
    # Speculative loads only go to GPUs with a free load link: skip the step when there is none.
    # ... and not while another expert's order beats prewarm's by more than the margin (experts.py)
    ahead = not cfg.no_regret or not cfg.expert_gate_ahead or st.experts.ahead_ok(cfg)
    if ahead and any(n < cfg.max_speculative_loads_per_gpu for n in pl.fleet.loading.values()):
        if pl.expect:
            step_partners(pl)
        step_speculative(pl, st.awake)
    if snapshot.config.fill_free_memory and st.unrequested:
        step_fill(pl, st.unrequested)
    if pl.fleet.nodes:
        likely = [m for m, (end, _a) in st.awake.items() if end > now]
        step_stage(pl, [*pl.evicted_now, *likely])
    st.link_waits = pl.link_waits
    return pl.actions


def feed_experts(pl: Values) -> None:
    """plan()'s hook: feed the call's new requests to the ghosts, the fleet's memory as their pool."""
    cap = 0
    for g in pl.fleet.gpus.values():
        cap += g.total_bytes
    models = pl.s.models

    def value(m: str) -> float:
        spec = models.get(m)
        return pl.loss(m) / max(spec.size_bytes / GIB, 1e-3) if spec is not None else 0.0

    # The ghosts' values must not change what the plan sees (measured: with them left in, ServeGen 24 h × 16
    # moved from 53,116 to 53,179 cold starts with no change of lead)
    kept = pl.values_kept()
    pl.st.experts.feed(pl.tr, models, cap, pl.now, pl.cfg, value, pl.cost, lambda m: not pl.fleet.ready(m))
    pl.forget_values_since(kept)
