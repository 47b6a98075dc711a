"""Partners: models that start together. Many models are asked for as a group (a pipeline's stages,
an ensemble, one application's functions): when one of them starts after a quiet stretch, the
others follow within seconds. Mined online from co-starts as in Defuse (Shen et al., "Defuse: A
Dependency-Guided Function Scheduler to Mitigate Cold Starts on FaaS Platforms", ICDCS 2021: strong
dependencies from frequent co-occurrence): of a leader's earlier starts, the share a partner started
within partner_window_s of. The history counts the co-starts (traffic.TrafficHistory._start); here
a fresh start of a leader becomes an expectation for its partners, which loss() values and
step_partners loads ahead."""

from __future__ import annotations

from .plan_call import PlanCall
from .steps import cooling, load_ahead
from .types import GIB
from .value import load_seconds
from .words import fmt_s


def expectations(pl: PlanCall) -> dict[str, tuple[float, str, int]]:
    """Model -> (P(a request within partner_window_s of its leader's start), leader, the second of that
    start), for partners of models that started in the last partner_window_s and have not been asked for
    since."""
    cfg = pl.cfg
    k = cfg.partner_min_count
    out: dict[str, tuple[float, str, int]] = {}
    if k <= 0:
        return out
    tr = pl.tr
    now = pl.now
    w = cfg.partner_window_s
    models = pl.models
    st = pl.st
    key = (id(tr), k, cfg.partner_precision)
    if st.partners_key != key:  # another history (a new leader's warm-up) or other thresholds: start again
        st.partners.clear()
        st.partners_key = key
    memo = st.partners
    for leader, s in tr.recent_starts().items():
        if not 0.0 <= now - s <= w:
            continue
        n = tr.starts(leader)
        version = tr.co_version(leader)
        got = memo.get(leader)
        if got is None or got[0] != n or got[1] != version:
            # a leader's partners change only with its starts or its co-starts: walk its table then, not on
            # every call (a busy fleet has tens of recent starts, each with up to partner_table partners)
            got = (n, version, _qualifying(tr.co_starts(leader), n - 1, k, cfg.partner_precision))
            memo[leader] = got
        for b, p in got[2]:
            if b not in models:
                continue
            last = tr.last_arrival(b)
            if last is not None and last >= s - w:
                continue  # it has come (or never left): not a prediction any more
            have = out.get(b)
            if have is None or p > have[0]:
                out[b] = (p, leader, s)
    return out


def _qualifying(co: dict[str, int], earlier: int, k: int, precision: float) -> list[tuple[str, float]]:
    """(partner, share of the leader's `earlier` starts it started with) for the partners seen with at least
    `k` of them and at least `precision` of them, in the table's order."""
    if earlier < k:
        return []
    out: list[tuple[str, float]] = []
    for b, c in co.items():
        if c < k:
            continue
        p = c / earlier
        if p >= precision:
            out.append((b, p))
    return out


def step_partners(pl: PlanCall) -> None:
    """Load ahead the expected partners that have no replica, most valuable first, as speculative
    loads (steps.load_ahead: the speculative rules)."""
    cfg = pl.cfg
    of_model = pl.fleet.of_model
    expect = pl.expect
    cands = [(-pl.loss(m), m) for m in expect if not of_model.get(m) and not cooling(pl, m)]

    def why(m: str, value: float) -> tuple[str, dict[str, float]]:
        p, leader, start = expect[m]
        spec = pl.s.models[m]
        ld = load_seconds(spec, cfg)
        return (f"partner of {leader}, which started {fmt_s(pl.now - start)} ago: it started within "
                f"{fmt_s(cfg.partner_window_s)} of {p:.0%} of {leader}'s earlier starts; "
                f"{spec.size_bytes / GIB:.1f} GiB, load {ld:.1f} s",
                {"p_partner": p, "loss_per_s": value, "load_s": ld})

    load_ahead(pl, cands, why)
