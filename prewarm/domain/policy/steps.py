"""plan()'s steps on GPUs, in the order it runs them: the idle-memory budget, demand loads, floors
(pinned / min_replicas), scale-out of capped models, a new GPU's share of the hottest models, and
speculative loads of models in a hot segment of their idle-time timeline."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from prewarm.domain.action_kinds import DEMAND, FILL, IDLE_BUDGET, MIN_REPLICAS, NEW_GPU, SCALE, SPECULATIVE
from prewarm.domain.states import READY

from .plan_call import PlanCall
from .types import GIB, ModelSpec, Placement
from .value import load_seconds
from .words import fmt_s, num

MAX_SPECULATIVE_TRIES = 24  # per tick, best first: bounds the work of one plan() call


def step_release(pl: PlanCall) -> None:
    """Evict without a load only over the idle-memory budget: on each GPU, while the replicas with
    no expected demand (pl.quiet, or never requested) hold more than the budget's share of it,
    the least valuable of them goes. No budget (the default): nothing is evicted here; a quiet
    replica stays resident as the first victim of a load that needs its memory."""
    budget = pl.cfg.idle_memory_budget
    if budget is None:
        return
    f = pl.fleet
    for gid in sorted(f.gpus):
        cap = budget * f.gpus[gid].total_bytes
        held = sum(r.bytes for m, r in f.on_gpu[gid].items()
                   if r.state == READY and (m, gid) not in f.evicting and not pl.expects_demand(m))
        if held <= cap:
            continue
        for _key, m, r in pl.victim_list(gid):  # least valuable first
            if held <= cap:
                break
            if pl.expects_demand(m):
                continue
            d = pl.idle(m)
            am = pl.arrival(m) if m in pl.s.models and d is not None else None
            why = ("never requested" if d is None or am is None else
                   f"quiet: idle {fmt_s(d)}, P(request within the next {fmt_s(pl.cfg.window_s)})="
                   f"{am.p_at(d):.3f}, next request expected in {fmt_s(am.mrl_at(d))}")
            pl.do_evict(
                r, IDLE_BUDGET,
                f"idle-memory budget: replicas with no expected demand hold {held / GIB:.1f} GiB of "
                f"{gid}, over its {budget:.0%} ({cap / GIB:.1f} GiB); {why}; least valuable of them",
                {"idle_gib": held / GIB, "budget_gib": cap / GIB, "idle_s": num(d),
                 "gib": r.bytes / GIB},
            )
            held -= r.bytes


def step_demand(pl: PlanCall, recent: Iterable[str]) -> None:
    cands = []
    since = pl.s.waiting_since
    for m in recent:
        spec = pl.s.models.get(m)
        if spec is None or pl.fleet.count(m) > 0:
            continue
        a = pl.tr.last_arrival(m)
        if m not in pl.s.waiting:
            # a recent request with no replica is unmet demand — unless it came before the
            # model's last eviction (it was served; reloading now would only undo the eviction)
            if a is None or pl.now - a > pl.cfg.demand_window_s:
                continue
            ev = pl.s.recent_evictions.get(m)
            if ev is not None and a + 1.0 <= ev:
                continue
        bound = pl.cfg.overdue_wait_s
        waited = pl.now - since[m] if bound is not None and m in pl.s.waiting and m in since else 0.0
        if bound is not None and waited >= bound:
            cands.append((0, -waited, m))  # overdue: the longest waiting first
            continue
        cands.append((1, -demand_weight(pl, m, load_seconds(spec, pl.cfg)), m))
    # placement is monotone in size for demand (held GPUs only grow): skip what cannot fit
    failed_size = math.inf
    for overdue, _c, m in sorted(cands):
        spec = pl.s.models[m]
        if spec.size_bytes >= failed_size:
            continue
        choice = pl.place(spec, DEMAND)
        if choice is None and overdue == 0:
            choice = hold_for(pl, spec)
        if choice is None:
            if overdue:
                failed_size = float(spec.size_bytes)
            continue
        # the reason is built only for a load that goes ahead
        rs, rl, rising = pl.rates(m)
        ld = load_seconds(spec, pl.cfg)
        trend = f" rising ×{rs / rl:.1f} vs {fmt_s(pl.cfg.long_window_s)} mean" if rising and rl > 0 else ""
        fc = pl.forecast(m, ld)
        wait = f"oldest waited {fmt_s(pl.now - since[m])}, overdue; " if overdue == 0 else ""
        pl.commit(
            spec, DEMAND, choice,
            f"{pl.s.waiting.get(m, 1)} request(s) waiting (last {fmt_s(pl.now - (pl.tr.last_arrival(m) or pl.now))} ago), "
            f"{wait}no replica; rate {rs:.2f}/s{trend}; "
            f"forecast {fc:.2f}/s in {ld:.0f} s; load {ld:.1f} s",
            {"rate_short": rs, "rate_long": rl, "forecast": fc, "load_s": ld},
        )


def demand_weight(pl: PlanCall, m: str, ld: float) -> float:
    """What one more second without model m costs, per second of its load (Smith's rule: the most first),
    in cold requests: its request rate (the requests that arrive meanwhile, each cold: the count), plus its
    waiting requests' seconds (each second n of them wait), at one load time a cold request (what a cold
    request costs in seconds), grown by the response ratio of Highest Response Ratio Next (Brinch Hansen,
    1971: (waited + load) / load) so that a model waiting many of its load times rises without bound.
    Rate alone (the count's order) starves a large, rarely asked model behind a stream of small busy ones:
    ServeGen 24 h on 8 × 80 GiB, cold requests waited 12× FaasCache's seconds (p99 31,004 s); with the
    waits counted, 0.79× (docs/simulation.md, issue 26)."""
    rate = max(pl.request_rate(m), 1e-6)
    n = pl.s.waiting.get(m, 0)
    if n:
        since = pl.s.waiting_since.get(m)
        waited = pl.now - since if since is not None else 0.0
        rate += n * (1.0 + max(waited, 0.0) / ld) / ld
    return rate / ld


def hold_for(pl: PlanCall, spec: ModelSpec) -> Placement | None:
    """An overdue model that place() could not fit (its victims are too young to evict, or the
    slots are busy) is given the GPU with the most memory it could ever free — free plus every
    replica not held by a floor. If that GPU has a free slot and its ready replicas, young ones
    included, make room, it goes there now (a request waiting this long outweighs the rule that
    keeps a new replica from being evicted at once); otherwise the GPU is held: no other load goes
    there, so its loads finish instead of being followed by new ones, and a later tick places it."""
    f = pl.fleet
    best: tuple[int, int, str] | None = None
    for gid, g in f.gpus.items():
        if gid in pl.held or g.total_bytes < spec.size_bytes or gid in f.of_model.get(spec.id, ()):
            continue
        freeable = f.avail(gid)
        for m, r in f.on_gpu[gid].items():
            if m not in pl.floors:  # pinned and min_replicas models
                freeable += r.bytes
        if freeable < spec.size_bytes:
            continue
        key = (-freeable, f.loading[gid], gid)
        if best is None or key < best:
            best = key
    if best is None:
        return None
    gid = best[2]
    pl.held[gid] = spec.id
    if pl.cfg.max_loads_per_gpu and f.loading[gid] >= pl.cfg.max_loads_per_gpu:
        return None
    ready = sorted((pl.loss(m) / max(r.bytes / GIB, 1e-3), m, r) for m, r in f.on_gpu[gid].items()
                   if m not in pl.floors and r.state == READY and r.in_flight == 0
                   and (m, gid) not in f.evicting)
    free, victims, loss = f.avail(gid), [], 0.0
    for vpb, _m, r in ready:
        if free >= spec.size_bytes:
            break
        victims.append(r)
        free += r.bytes
        loss += vpb * r.bytes / GIB
    return Placement(gid, victims, loss) if free >= spec.size_bytes else None


def step_floor(pl: PlanCall) -> None:
    for m in pl.st.special:
        spec = pl.s.models.get(m)
        if spec is None:
            continue
        floor = max(spec.min_replicas, 1 if spec.pinned else 0)
        while pl.fleet.count(m) < floor:
            have = pl.fleet.count(m)
            if not pl.load(spec, MIN_REPLICAS,
                             f"{'pinned, ' if spec.pinned else ''}min_replicas {floor}, has {have}",
                             {"min_replicas": floor, "replicas": have}):
                break

def step_scale(pl: PlanCall) -> None:
    for m in pl.st.special:
        spec = pl.s.models.get(m)
        if spec is None or not spec.max_rate_per_replica or pl.fleet.count(m) == 0:
            continue
        ld = load_seconds(spec, pl.cfg)
        fc = pl.forecast(m, ld + pl.cfg.tick_s)
        rs, rl, rising = pl.rates(m)
        # 5 % tolerance: a rate sitting exactly at n × capacity needs n replicas, not n + 1
        want = max(1, math.ceil(max(fc, rs) / spec.max_rate_per_replica - 0.05))
        while pl.fleet.count(m) < want:
            have = pl.fleet.count(m)
            trend = f" rising ×{rs / rl:.1f} vs {fmt_s(pl.cfg.long_window_s)} mean;" if rising and rl > 0 else ";"
            if not pl.load(
                spec, SCALE,
                f"rate {rs:.2f}/s{trend} forecast {fc:.2f}/s in {ld + pl.cfg.tick_s:.0f} s "
                f"> {have} × {spec.max_rate_per_replica:g}/s per replica; load {ld:.1f} s",
                {"rate_short": rs, "rate_long": rl, "forecast": fc, "replicas": have,
                 "want": want, "load_s": ld},
            ):
                break

def step_new_gpu(pl: PlanCall) -> None:
    cfg = pl.cfg
    fresh = [g for g in sorted(pl.fleet.gpus)
             if 0 <= pl.now - pl.fleet.gpus[g].joined_at < cfg.new_gpu_window_s]
    if not fresh:
        return
    hot = sorted(
        ((-pl.tr.rate_short(m, pl.now), m) for m in pl.tr.models() if m in pl.s.models),
    )
    hot = [(r, m) for r, m in hot if r < 0][: cfg.new_gpu_hot_models]
    fresh_set = set(fresh)
    for gid in fresh:
        g = pl.fleet.gpus[gid]
        for negr, m in hot:
            spec = pl.s.models[m]
            hosts = pl.fleet.of_model.get(m, [])
            if gid in hosts or m in pl.fleet.on_gpu[gid]:
                continue
            if any(h in fresh_set for h in hosts):
                continue  # GPUs joining together (a fleet starting cold) share the hottest, not copy them
            if pl.fleet.avail(gid) < spec.size_bytes:
                continue
            if pl.fleet.spec[gid] + spec.size_bytes > cfg.speculative_share * g.total_bytes:
                continue
            pl.do_preload(
                spec, gid, NEW_GPU,
                f"{gid} joined {fmt_s(pl.now - g.joined_at)} ago; {m} is among the "
                f"{cfg.new_gpu_hot_models} hottest models at {-negr:.2f}/s → preload on {gid}",
                {"rate_short": -negr},
            )
            pl.fleet.spec[gid] += spec.size_bytes  # unrequested on this GPU: count as speculative

def step_speculative(pl: PlanCall, awake: dict[str, tuple[float, float]]) -> None:
    """`awake`: the state's hot segments (model -> (end, anchor)); ended ones are dropped here."""
    cfg = pl.cfg
    cands = []
    now = pl.now
    models = pl.models
    of_model = pl.fleet.of_model
    # in the dict's order, not sorted: cands are sorted below by (value, model) and nothing here depends on
    # the order the models are visited in (loss() and arrival() only fill the call's memos)
    for m, (end, anchor) in list(awake.items()):  # (advance drops an entry whose model's timeline moved)
        if end <= now:
            del awake[m]  # the segment ended
            continue
        if of_model.get(m) or m not in models or cooling(pl, m):
            continue
        d = max(0.0, now - anchor)
        am = pl.arrival(m)
        if am.segment_at(d) != "hot":
            continue
        cands.append((-pl.loss(m), m))

    def why(m: str, value: float) -> tuple[str, dict[str, float]]:
        d = pl.idle(m) or 0.0
        am = pl.arrival(m)
        ld = load_seconds(models[m], cfg)
        p = am.p_at(d)
        return (f"idle {fmt_s(d)}; idle-time histogram ({am.samples:.0f} gaps) gives "
                f"P(request within {fmt_s(ld + cfg.tick_s + 5 + cfg.window_s)})={p:.2f}, next expected in "
                f"{fmt_s(am.mrl_at(d))}; {pl.cost(m):.1f} cold requests per reload; load {ld:.1f} s",
                {"idle_s": d, "p_soon": p, "expected_next_s": num(am.mrl_at(d)),
                 "loss_per_s": value, "load_s": ld, "gaps": am.samples})

    load_ahead(pl, cands, why)


def cooling(pl: PlanCall, model: str) -> bool:
    """Evicted less than eviction_cooldown_s ago: no load ahead of it yet (it would undo the eviction)."""
    ev = pl.s.recent_evictions.get(model)
    return ev is not None and pl.now - ev < pl.cfg.eviction_cooldown_s


def load_ahead(pl: PlanCall, cands: list[tuple[float, str]],
               why: Callable[[str, float], tuple[str, dict[str, float]]]) -> None:
    """Speculative loads of `cands` ((-value, model), the most valuable first, at most
    MAX_SPECULATIVE_TRIES tried) under the speculative rules of placement.place: a GPU with a free
    speculative link, the speculative share, victims worth prefetch_margin times less than the value.
    `why(model, value)`: the load's reason and numbers."""
    cands.sort()
    record = pl.st.ahead if pl.cfg.ahead_gate else None
    # held back by their record (ahead.py): the loads the rules pick are still made as shadows (judged, not
    # loaded), so the record sees whether they would pay again
    shadow = record is not None and not record.open()
    for negl, m in cands[:MAX_SPECULATIVE_TRIES]:
        if all(n >= pl.cfg.max_speculative_loads_per_gpu for n in pl.fleet.loading.values()):
            break  # every GPU's load bandwidth is taken
        if shadow and not record.wants(m):  # type: ignore[union-attr]
            continue
        spec = pl.s.models[m]
        choice = pl.place(spec, SPECULATIVE, -negl)
        if choice is None:
            continue
        if record is not None:
            ready = pl.now + pl.reload_s(spec) * pl.slowdown
            record.bet(m, tuple(r.model for r in choice.victims), pl.now, shadow, ready,
                       pl.link_rate(keep=False) * (ready - pl.now))
            if shadow:
                continue
        reason, numbers = why(m, -negl)
        if record is not None:
            reason = f"{reason}; {record.why()}"
        pl.commit(spec, SPECULATIVE, choice, reason, numbers)


def step_fill(pl: PlanCall, unrequested: list[tuple[float, str]]) -> None:
    """Free memory takes catalog models never requested (issue 12: with memory to spare, a first
    request need not be cold; issue 26, item 3: where the room holds some but not all of them, it
    takes what fits). `unrequested`: (load time, model) of the catalog's models with no request yet,
    shortest first: with no traffic one is as likely to be asked for as another, so the shortest load
    buys the most first requests per second of link time (and frees its link soonest for a demand
    load that may come while it runs). Only into memory no load needs (no eviction; within the
    idle-memory budget; a GPU at most fill_share full after the load while fills pay on this traffic,
    speculative_share full while they do not: firsts.py), one load per GPU whose link is idle, and only
    while no request waits for a replica: a fill load must not take bandwidth from a demand load, and one
    still loading when a demand load comes to its GPU is cancelled (PlanCall.yield_link). In prewarm's
    order a fill replica is worth the measured rate of first requests (PolicyConfig.first_request_value):
    it goes before every resident worth more, so it costs a later load nothing but its link time, and
    after the quiet residents less likely to be asked for than an unrequested model is (in the other
    experts' orders it is first, as a never-requested model). A model filled once and evicted unrequested
    is not filled again (its eviction is in `recent_evictions`: the room it had is one loads need)."""
    cfg = pl.cfg
    f = pl.fleet
    idle = [g for g in sorted(f.gpus) if f.loading[g] == 0]
    if not idle or pl.s.waiting:
        return
    budget = cfg.idle_memory_budget
    # all free memory while fills pay on this traffic, else the speculative share (firsts.py)
    share = cfg.fill_share if pl.st.firsts.fills_pay() else min(cfg.fill_share, cfg.speculative_share)
    # the record behind it, where it decides something (a fresh state has none: it is no cache)
    decides = cfg.fill_share > cfg.speculative_share or cfg.first_request_value
    record = f"; {pl.st.firsts.why()}" if decides else ""
    evicted = pl.s.recent_evictions
    # the candidates, once for all GPUs: a few per idle link (the list may hold thousands)
    cands: list[tuple[float, str]] = []
    for c in unrequested:
        m = c[1]
        if not f.count(m) and m not in evicted:
            cands.append(c)
            if len(cands) >= 4 * len(idle):
                break
    for gid in idle:
        if not cands:
            break
        total = f.gpus[gid].total_bytes
        room: float = min(float(f.avail(gid)), share * total - f.used[gid])
        if budget is not None:
            held = sum(r.bytes for m, r in f.on_gpu[gid].items()
                       if (m, gid) not in f.evicting and not pl.expects_demand(m))
            room = min(room, budget * total - held)
        if room <= 0:
            continue
        for i, (ld, m) in enumerate(cands):
            spec = pl.s.models[m]
            if spec.size_bytes > room or (m, gid) in f.evicting:
                continue
            pl.do_preload(spec, gid, FILL,
                          f"{gid} has {room / GIB:.1f} GiB no load needs and an idle link; {m} has no "
                          f"request yet (the shortest load that fits, {ld:.1f} s, of the catalog's "
                          f"unrequested models{record}) → preload on {gid}",
                          {"load_s": ld, "room_gib": room / GIB, "fill_share": share})
            del cands[i]
            break
