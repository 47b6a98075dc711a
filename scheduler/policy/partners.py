"""Partners: models that start together. Many models are asked for as a group (a pipeline's stages,
an ensemble, one application's functions): when one of them starts after a quiet stretch, the
others follow within seconds. Mined online from co-starts as in Defuse (Shen et al., "Defuse: A
Dependency-Guided Function Scheduler to Mitigate Cold Starts on FaaS Platforms", ICDCS 2021: strong
dependencies from frequent co-occurrence): of a leader's earlier starts, the share a partner started
within partner_window_s of. The history counts the co-starts (traffic.TrafficHistory._start); here
a fresh start of a leader becomes an expectation for its partners, which loss() values and
step_partners loads ahead."""

from __future__ import annotations

from .tick import Tick
from .types import GIB
from .value import load_seconds
from .words import fmt_s

MAX_PARTNER_TRIES = 24  # per tick, best first: bounds the work of one plan() call


def expectations(pl: Tick) -> dict[str, tuple[float, str]]:
    """Model -> (P(a request within partner_window_s of its leader's start), leader), for partners of
    models that started in the last partner_window_s and have not been asked for since."""
    cfg = pl.cfg
    k = cfg.partner_min_count
    out: dict[str, tuple[float, str]] = {}
    if k <= 0:
        return out
    tr = pl.tr
    now = pl.now
    w = cfg.partner_window_s
    models = pl.s.models
    for leader, s in tr.recent_starts().items():
        if not 0.0 <= now - s <= w:
            continue
        earlier = tr.starts(leader) - 1
        if earlier < k:
            continue
        for b, c in tr.co_starts(leader).items():
            if c < k or b not in models:
                continue
            p = c / earlier
            if p < cfg.partner_precision:
                continue
            last = tr.last_arrival(b)
            if last is not None and last >= s - w:
                continue  # it has come (or never left): not a prediction any more
            got = out.get(b)
            if got is None or p > got[0]:
                out[b] = (p, leader)
    return out


def step_partners(pl: Tick) -> None:
    """Load ahead the expected partners that have no replica, most valuable first, as speculative
    loads (their placement's rules: a free speculative link, the speculative share, victims worth
    prefetch_margin times less)."""
    cfg = pl.cfg
    of_model = pl.fleet.of_model
    now = pl.now
    cands = []
    for m, (p, leader) in pl.expect.items():
        if of_model.get(m):
            continue
        ev = pl.s.recent_evictions.get(m)
        if ev is not None and now - ev < cfg.eviction_cooldown_s:
            continue
        cands.append((-pl.loss(m), m, p, leader))
    cands.sort()
    for negl, m, p, leader in cands[:MAX_PARTNER_TRIES]:
        if all(n >= cfg.max_speculative_loads_per_gpu for n in pl.fleet.loading.values()):
            break
        spec = pl.s.models[m]
        choice = pl.place(spec, "speculative", -negl)
        if choice is None:
            continue
        ld = load_seconds(spec, cfg)
        pl.commit(
            spec, "speculative", choice,
            f"partner of {leader}, which started {fmt_s(now - (pl.tr.recent_starts().get(leader) or now))} ago: "
            f"it started within {fmt_s(cfg.partner_window_s)} of {p:.0%} of {leader}'s earlier starts; "
            f"{spec.size_bytes / GIB:.1f} GiB, load {ld:.1f} s",
            {"p_partner": p, "loss_per_s": -negl, "load_s": ld},
        )
