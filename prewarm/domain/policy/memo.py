"""What plan() carries from one call to the next: PolicyState, and the loss() inputs it caches."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from .ahead import AheadRecord
from .arrivals import ArrivalModel
from .experts import Experts
from .firsts import FirstRequests
from .types import ModelSpec, PolicyConfig
from .words import fmt_s


class ValueInputs:
    """A model's loss() inputs that hold until its traffic changes (timeline.advance drops the entry)
    or its idle time enters the next grid cell: the idle-time model's return rate there, the extra
    requests per active minute, and the long-rate EWMA's parts. `steady_from`: from this time on
    the long rate is below inv_mrl and stays there (it only decays), so loss() skips it."""

    __slots__ = ("spec", "anchor", "cell", "inv_mrl", "extra", "rate", "load_s", "steady_from")

    def __init__(self, spec: ModelSpec, anchor: float, cell: int, inv_mrl: float, extra: float,
                 rate: tuple[float, float, float, float], load_s: float) -> None:
        self.spec = spec
        self.anchor = anchor
        self.cell = cell
        self.inv_mrl = inv_mrl
        self.extra = extra
        self.rate = rate
        self.load_s = load_s
        self.steady_from = math.inf


@dataclass
class PolicyState:
    """Optional cache carried from one plan() call to the next (the caller keeps it).

    It holds only things derived from the traffic (per-model arrival models and a timeline of
    when each model becomes hot or cold), so plan(s, now, state) decides the same as
    plan(s, now) with a fresh state; it just does not recompute every model on every tick.
    Use one state per TrafficHistory; a different history or config resets it, a different catalog
    mapping updates what changed in it (a mapping handed to plan() must not be changed afterwards).
    """

    traffic_id: int = 0
    # the demand loads the last call held back for a busy link (PolicyConfig.link_wait), as (model, GPU, seconds
    # until its link frees): while there are any, the plan is woken when a load ends
    link_waits: list[tuple[str, str, float]] = field(default_factory=list)
    # the catalog mapping the state was last brought up to date with (timeline.advance compares the next
    # one with it spec by spec; held, so an identity check against it cannot meet a reused id)
    models: Mapping[str, ModelSpec] | None = None
    seq: int = -1
    arrival: dict[str, tuple[tuple[int, float], ArrivalModel]] = field(default_factory=dict)
    # (start, model, end, its timeline's key as in `scheduled`): an entry of a replaced timeline is dropped
    hot_heap: list[tuple[float, str, float, tuple[float, tuple[int, float]]]] = field(default_factory=list)
    cold_heap: list[tuple[float, str, float, tuple[float, tuple[int, float]]]] = field(default_factory=list)
    awake: dict[str, tuple[float, float]] = field(default_factory=dict)  # model -> (end, arrival)
    due: dict[str, tuple[float, float]] = field(default_factory=dict)
    # (end, model) of each entry put in `due` (stale ones skipped when popped): the ended ones leave in order
    due_ends: list[tuple[float, str]] = field(default_factory=list)
    recent: dict[str, float] = field(default_factory=dict)  # model -> last arrival, for demand
    scheduled: dict[str, tuple[float, tuple[int, float]]] = field(default_factory=dict)  # model -> (anchor, timeline key)
    value: dict[str, ValueInputs] = field(default_factory=dict)  # model -> loss() inputs (see ValueInputs)
    config: PolicyConfig | None = None  # the config the cached arrival models were built with
    special: tuple[str, ...] = ()  # models with min_replicas / pinned / a rate cap
    # the catalog's median load time (s), kept with `models`: the eviction horizon's floor (placement.horizon)
    catalog_load_s: float = 0.0
    # the catalog's models with no request yet, (load s, model) shortest first, and their ids
    unrequested: list[tuple[float, str]] = field(default_factory=list)
    unrequested_ids: set[str] = field(default_factory=set)
    # how often they get their first request, and whether fills are asked for before they go (firsts.py): a
    # record, not a cache, as the no-regret layer's and the loads-ahead records below
    firsts: FirstRequests = field(default_factory=FirstRequests)
    # the catalog's models with a max_replica_age (refresh.py), and the models mapping they were read from
    aged: tuple[str, ...] = ()
    aged_of: Mapping[str, ModelSpec] | None = None
    # leader -> (its starts, its co-start table's version, its partners that qualify: (partner, share of the
    # leader's earlier starts)), as partners.expectations last found them for the history and thresholds in
    # partners_key (id of the TrafficHistory, partner_min_count, partner_precision)
    partners: dict[str, tuple[int, int, list[tuple[str, float]]]] = field(default_factory=dict)
    partners_key: tuple[int, int, float] = (0, 0, 0.0)
    # The no-regret layer's record (experts.py, duels.py): the one part of the state that is not a cache. It
    # is the duels of the real evictions against the experts' orders (and their ghosts) over the request
    # stream fed so far, so a kept state orders evictions by the leading expert where a fresh one (no record
    # yet) uses prewarm's own order.
    experts: Experts = field(default_factory=Experts)
    # The loads-ahead record (ahead.py), the other part that is not a cache: the bets loads ahead made and
    # what they won or lost on this traffic, which gates them (PolicyConfig.ahead_gate)
    ahead: AheadRecord = field(default_factory=AheadRecord)

    def link_wait_why(self) -> str:
        """For the leader's status and the console: the demand loads the last call held back for a busy link and
        why (PolicyConfig.link_wait), "" when none: a waiting model has no action to name it in the events."""
        if not self.link_waits:
            return ""
        shown = "; ".join(f"{m} for {gpu}'s link (free in about {fmt_s(s)})" for m, gpu, s in self.link_waits[:5])
        more = f"; and {len(self.link_waits) - 5} more" if len(self.link_waits) > 5 else ""
        return (f"{len(self.link_waits)} demand load(s) wait for a busy link: {shown}{more}. Sharing a link would "
                f"slow the load on it and end theirs about as late; they start when it frees")
