"""Plain, frozen data types shared by the policy, the live scheduler and the simulator.

Everything here is data: no Redis, no clock, no I/O. Times are Unix seconds (floats) on the
caller's clock; the simulator uses a virtual clock starting at 0. Sizes are bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

# The state names are spelled once, in a dependency-free core module (the policy stays pure).
from prewarm.domain.states import ReplicaStateName as ReplicaStateName

# PolicyConfig.refute_stale_rate's readings
STALE_RATE_READINGS = ("auto", "on", "off")
GIB = 1 << 30

@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Every knob of the policy, with defaults that hold for both traces and the live system."""

    tick_s: float = 2.0  # how often plan() runs; used for lead times
    speculative_share: float = 0.6  # share of each GPU that predicted-but-unrequested models may hold
    min_residency_s: float = 10.0  # a replica is never evicted sooner than this after it started loading
    eviction_cooldown_s: float = 120.0  # no speculative reload of a model this soon after its eviction
    # Default load time for a model never measured: fixed + size / bandwidth + warmup per GiB.
    load_fixed_s: float = 1.5
    load_bandwidth_bytes_per_s: float = 2.0 * GIB
    warmup_s_per_gib: float = 0.1
    # Rates: exponentially weighted windows (time constants) over per-second counts.
    panic_window_s: float = 10.0  # trend of a model that only started (windows see the same past)
    short_window_s: float = 60.0
    long_window_s: float = 600.0
    rise_factor: float = 2.0  # short rate > rise_factor × long rate ...
    rise_floor_per_s: float = 0.05  # ... and above this floor = rising
    demand_window_s: float = 10.0  # a request this recent with no replica is unmet demand
    # A model whose oldest waiting request has waited this long is overdue: it is placed before
    # every other load, and the GPU it will take is held for it (no other load goes there) until it
    # fits, evicting replicas younger than min_residency_s if need be. Without it the
    # most-requests-per-load-second order (which minimises cold starts) can starve a large, rarely
    # requested model behind a stream of small ones. It bounds waits at a price in cold starts where
    # load links are short (60 s: +6.4 % on the 1,350-model day on 8 GPUs), so it is the operator's
    # choice (PREWARM_MAX_DEMAND_WAIT); None: off.
    overdue_wait_s: float | None = None
    # Idle-time histogram (Shahrad et al. 2020): 1-minute bins over 4 hours.
    hist_bin_s: float = 60.0
    hist_bins: int = 240
    grid_s: float = 30.0  # resolution of the derived hot/cold timeline
    prior_alpha: float = 2.0  # Lomax prior on idle time for models with few samples
    prior_beta_s: float = 600.0
    prior_weight: float = 2.0  # the prior counts as this many observed idle times
    tail_mean_s: float = 4 * 3600.0  # mean idle beyond the histogram's range
    window_s: float = 60.0  # "hot" = P(request within lead + window_s) >= p_prefetch
    p_prefetch: float = 0.3
    p_release: float = 0.02  # "quiet" when P(request within lead + window_s) stays below this ...
    release_min_gap_s: float = 600.0  # ... for at least this long
    # A quiet replica is not evicted for being quiet; it stays resident as the first victim when a
    # load needs memory. Only this budget evicts without a load: the share of each
    # GPU that replicas with no expected demand (quiet, or never requested) may hold; over it,
    # the least valuable go first. None: unlimited (PREWARM_IDLE_MEMORY_BUDGET).
    idle_memory_budget: float | None = None
    # Free memory no load needs takes catalog models never requested, shortest load first, one per
    # idle link while no request waits (a first request need not be cold; see fill_share, first_request_value)
    fill_free_memory: bool = True
    # A fill loading on a GPU that a demand load goes to is cancelled (an Evict of kind "yield"), and a GPU whose
    # link carries only fills counts as idle for a demand load: a guess must not halve a demand load's
    # bandwidth (PlanCall.yield_link; measured in docs/simulation.md, "Fills give way to demand loads")
    fill_yields: bool = True
    # The fill takes free memory up to this share of a GPU while fills pay on this traffic (firsts.py: at least as
    # many asked for while resident as evicted unasked, decayed), and up to speculative_share while they do not.
    # Fixed at speculative_share, most first requests on Azure 1,350 × 32 came cold (1,762 cold starts; oracle
    # 930); all free memory always cost ServeGen × 32 and Azure 1,350 × 16 up to 1.6 % (docs/simulation.md,
    # "First requests, valued and measured")
    fill_share: float = 1.0
    # In prewarm's value order a model never requested is worth the rate at which the catalog's never-requested
    # models get their first request (firsts.py), not 0: a fill outranks a resident that is less likely to be
    # asked for than an unrequested model is (Azure: 0.05-0.35 per hour; ServeGen: 0.01-0.04). Off: 0, so fills
    # are the first victims of prewarm's order as of every other expert's
    first_request_value: bool = True
    prefetch_margin: float = 2.0  # speculative load must be worth this many times what it evicts
    # Partners (partners.py): a model that starts (its first request, or one after partner_gap_s idle)
    # is a sign for the models that started within partner_window_s of at least partner_min_count and
    # partner_precision of its earlier starts: they are expected within the window, valued so and loaded
    # ahead (the precision's measured effect: docs/simulation.md, "Partners"). partner_min_count 0: off. Bounds: a
    # start that finds more than partner_max_group others started in its window (a timer every model
    # shares, a restart) pairs with none, and a model keeps at most partner_table partners (0: no bound).
    partner_gap_s: float = 300.0
    partner_window_s: float = 60.0
    partner_min_count: int = 2
    partner_precision: float = 0.75
    partner_max_group: int = 128
    partner_table: int = 128
    # The no-regret layer (experts.py, duels.py; issue 26): the eviction orders of prewarm, greedy-dual
    # (FaasCache), LRU and the forecast rule; the one whose victims the real fleet's requests show to be the
    # better (duels at each eviction, then a trial of the real evictions' cost; decayed with this half-life)
    # orders real evictions. On by default (PREWARM_NO_REGRET=0: off): a new lead is tried in turns with the order
    # it would replace, failed as soon as its victims cost more or its windows serve a larger share of requests
    # cold, passed only after 12 windows each at 10 % cheaper and 10 % less cold (duels.py); greedy-dual ranks real
    # victims by keys kept on the real fleet (experts.py). So built, the whole sweep with the layer on is within
    # 1 % of off at every point (+0.83 % at most, Azure 1,350 × 8 seed 1; measured with fills giving way).
    # Judged by ghost fleets' misses instead (expert_duels=False), ServeGen 72 h × 16 seed 0: greedy-dual led
    # the ghosts by 18 % and following it gave +15 %. See docs/simulation.md.
    # On 60 ServeGen streams with 2-7 GiB models, 14 days, 1 / 2 / 4 GPUs of 40 GiB: 175,551 / 32,027 / 1,741 cold
    # starts with the layer, 175,551 / 31,963 / 1,738 without (FaasCache 482,848 / 46,910 / 6,191; with the
    # first-request rules above, fill_share and first_request_value, 175,602 / 32,036 / 1,756). It had been
    # 843,055 on one GPU while the layer's request count halved with busy models' histograms (history.py).
    no_regret: bool = True
    expert_halflife_s: float = 3600.0
    expert_margin: float = 0.05
    # with the layer on: loads ahead only while prewarm's ghost is within the margin of the leader's. Off:
    # the ghosts do not load ahead, so their record says nothing of what loads ahead are worth (Azure
    # 500 × 16: the same 705 cold starts with it on or off)
    expert_gate_ahead: bool = False
    # How the lead is judged: True, by duels of the real fleet's evictions against each expert's (duels.py);
    # False, by the ghosts' misses (experts.py)
    expert_duels: bool = True
    # With the layer on: whole baselines (on-demand LRU, FaasCache) run on shadow fleets of the real one's shape
    # fed the same requests, and one takes over the plan while its shadow's cold requests stay below the real
    # fleet's by a margin (prewarm.domain.whole). Off: prewarm's plan always
    whole_experts: bool = True
    # Loads ahead (speculative, partners) go on while their real record says they pay (ahead.py: each is a
    # bet that its model is asked for before its victims; decayed with expert_halflife_s). Off: always on
    ahead_gate: bool = True
    max_speculative_loads_per_gpu: int = 1  # speculative loads must not starve demand loads of bandwidth
    # Loads in flight per GPU, of any kind (0: no limit). Loads sharing a GPU's link each slow to 1/k,
    # so every request waiting on them waits longer; the worker runs this many at once
    # (PREWARM_MAX_LOADS_PER_GPU) and queues the rest. A load finds a GPU with a free slot, or
    # waits in the plan for the next tick, where the most valuable waiting load goes first.
    max_loads_per_gpu: int = 2
    # A demand load waits for a busy link where that costs fewer cold requests than sharing it, and the plan wakes
    # when a load ends (placement.place). On, with yields off the fill's record (firsts.py): ServeGen x 8 / x 16
    # -44 / -15 % cold starts, Azure 1,350 x 8 / x 32 -10 / -13 %, every other point within +1.2 % (docs/simulation.md,
    # "The link wait on by default")
    link_wait: bool = True
    # A model's measured (10-minute) rate stops valuing it once the silence since its last request is implausible at
    # that rate (value.stale): a stream that stopped is then valued by its idle-time model, not by the rate it had
    # while it ran. "on" / "off" always; "auto" (the default) while the fleet's own record says such silences have
    # lately been stops more often than pauses (silences.py): on bursty on/off traffic -14 to -25 % cold starts, and
    # nothing changes on the real families, whose long silences are mostly pauses and where "on" cost up to +5.7 %
    # (docs/simulation.md, "A stopped stream's rate, chosen at run time"). PREWARM_REFUTE_STALE_RATE
    refute_stale_rate: str = "auto"
    new_gpu_window_s: float = 120.0  # a GPU this recently joined gets the hottest models
    new_gpu_hot_models: int = 4
    # Host-memory staging tier (issue 4): a model staged in a node's host cache loads onto that
    # node's GPUs without touching storage. Default promotion time for a model never measured:
    promote_fixed_s: float = 0.5
    promote_bandwidth_bytes_per_s: float = 16.0 * GIB  # pinned host → device
    max_stages_per_node: int = 2  # stages in flight per node: they share its storage bandwidth
    stage_margin: float = 2.0  # a stage must be worth this many times the staged bytes it evicts
    stage_recent_s: float = 3600.0  # a model evicted from its GPUs this recently may be staged
    # LoRA adapters (adapters.py, issue 29): one more base replica, in free memory only, when a base's adapters
    # expected soon outnumber its replicas' slots (off: the adapters share the replicas the bases' plan keeps)
    adapter_slot_replicas: bool = True

    def default_promote_seconds(self, size_bytes: int) -> float:
        return (
            self.promote_fixed_s
            + size_bytes / self.promote_bandwidth_bytes_per_s
            + self.warmup_s_per_gib * size_bytes / GIB
        )

    def default_load_seconds(self, size_bytes: int) -> float:
        return (
            self.load_fixed_s
            + size_bytes / self.load_bandwidth_bytes_per_s
            + self.warmup_s_per_gib * size_bytes / GIB
        )


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A catalog entry as the policy sees it."""

    id: str
    size_bytes: int
    version: str = "1"
    load_seconds: float | None = None  # measured p50 of load + warmup; None = derive from size
    pinned: bool = False  # never evicted; kept on at least one GPU
    min_replicas: int = 0
    max_rate_per_replica: float | None = None  # requests/s one replica serves; None = unbounded
    promote_seconds: float | None = None  # measured p50 of host cache → device + warmup; None = derive
    priority: int = 1  # prewarm.priority.rank: 0 low, 1 normal, 2 high (a speculative load never evicts higher)
    max_replica_age_s: float | None = None  # replicas older than this are replaced (refresh.py); None: never
    # LoRA adapters (issue 29, adapters.py): an adapter names its base (it lives only inside a ready replica of
    # it); a base gives its replicas' LoRA slots (0: not a base)
    base: str | None = None
    max_adapters: int = 0


@dataclass(frozen=True, slots=True)
class GpuState:
    id: str  # "<node>/<device>", e.g. "node-a/cuda:1"
    node: str
    total_bytes: int  # the memory budget of this device
    free_bytes: int  # measured by the worker
    joined_at: float = 0.0
    alive: bool = True


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node's host-memory cache (the staging tier): its budget and measured free bytes."""

    id: str  # the node name, as in GpuState.node
    budget_bytes: int
    free_bytes: int
    alive: bool = True


@dataclass(frozen=True, slots=True)
class StagedState:
    """One model's bytes in a node's host cache ("staging" while being read, then "staged")."""

    model: str
    node: str
    state: str  # "staging" | "staged"
    bytes: int
    since: float  # when staging started
    version: str = "1"


@dataclass(frozen=True, slots=True)
class ReplicaState:
    model: str
    gpu: str
    state: str  # one of ReplicaStateName
    bytes: int
    since: float  # when it entered its current residency (load start)
    version: str = "1"
    last_request: float | None = None  # last request served by this replica
    in_flight: int = 0  # requests being served right now
    ready_at: float | None = None  # when it became ready (its age, for refresh); None: not ready / not known
    host: str | None = None  # an adapter's replica: the base model whose replica on this GPU holds it


class Placement(NamedTuple):
    """placement.place()'s choice for one more replica: the GPU, the replicas to evict there first, and the
    loss (value per GiB times bytes) of those victims."""

    gpu: str
    victims: list[ReplicaState]
    loss: float


@dataclass(frozen=True, slots=True)
class Intent:
    """An action dispatched but not yet confirmed by the worker; it expires at expires_at."""

    model: str
    gpu: str  # the GPU id; for "stage"/"unstage", the node id
    kind: Literal["preload", "evict", "stage", "unstage"]
    expires_at: float
    bytes: int = 0
    version: str = "1"


class TrafficView(Protocol):
    """Read-only view of per-model traffic that plan() uses (TrafficHistory implements it)."""

    @property
    def seq(self) -> int: ...

    def changed_since(self, seq: int) -> list[str] | None: ...

    def models(self) -> list[str]: ...

    def last_arrival(self, model: str) -> float | None: ...

    def rate_panic(self, model: str, now: float) -> float: ...

    def rate_short(self, model: str, now: float) -> float: ...

    def rate_long(self, model: str, now: float) -> float: ...

    def lag(self, model: str, now: float, tau: float) -> float: ...

    def total(self, model: str) -> float: ...

    def requests_per_active_minute(self, model: str) -> float: ...

    def stable_requests_per_active_minute(self, model: str) -> float: ...

    def stable_version(self, model: str) -> int: ...

    def value_inputs(self, model: str) -> tuple[float, tuple[float, float, float, float]] | None: ...

    def stable_histogram(self, model: str) -> tuple[int, tuple[float, ...], float] | None: ...

    def starts(self, model: str) -> int: ...

    def recent_starts(self) -> dict[str, int]: ...

    def co_starts(self, model: str) -> dict[str, int]: ...

    def co_version(self, model: str) -> int: ...


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the scheduler knows at one tick. plan() reads it and never changes it.

    `traffic` is a live TrafficHistory the caller keeps feeding between ticks; the caller must not
    feed it while plan() runs. `waiting` lists models whose requests wait for a replica.
    `recent_evictions` maps a model to the time of its last eviction
    (from the event log) so that the policy can keep its cooldown without state of its own.
    """

    models: Mapping[str, ModelSpec]
    gpus: tuple[GpuState, ...]
    replicas: tuple[ReplicaState, ...]
    traffic: TrafficView
    intents: tuple[Intent, ...] = ()
    recent_evictions: Mapping[str, float] = field(default_factory=dict)
    # models with requests waiting for a replica (the route hook answered "cold" and none is
    # loading yet): they are loaded as demand however old the request
    waiting: Mapping[str, int] = field(default_factory=dict)
    # model -> when its oldest waiting request arrived (the route hook's first cold lookup)
    waiting_since: Mapping[str, float] = field(default_factory=dict)
    config: PolicyConfig = field(default_factory=PolicyConfig)
    # the staging tier: each node's host cache and what it holds (empty: no staging tier)
    nodes: tuple[NodeState, ...] = ()
    staged: tuple[StagedState, ...] = ()
    # seconds from a cold request to its demand load's start, as the live fleet measured them lately (the median;
    # 0: none measured, and in the simulator, whose engine has no such delay): the whole experts' shadows pay it
    demand_delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Preload:
    model: str
    gpu: str
    kind: str  # a load kind (prewarm.domain.action_kinds.LOAD_KINDS)
    reason: str
    numbers: Mapping[str, float] = field(default_factory=dict)
    version: str = "1"
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class Evict:
    model: str
    gpu: str
    kind: str  # an eviction kind (prewarm.domain.action_kinds.EVICT_KINDS)
    reason: str
    numbers: Mapping[str, float] = field(default_factory=dict)
    version: str = "1"


@dataclass(frozen=True, slots=True)
class Stage:
    """Read a model's bytes into a node's host cache, so that a later preload there skips storage."""

    model: str
    node: str
    kind: str  # a stage kind (prewarm.domain.action_kinds.STAGE_KINDS)
    reason: str
    numbers: Mapping[str, float] = field(default_factory=dict)
    version: str = "1"
    bytes: int = 0
    value: float = 0.0  # cold requests/s its absence would cause: the host cache evicts by value per byte


@dataclass(frozen=True, slots=True)
class Unstage:
    """Drop a model's bytes from a node's host cache."""

    model: str
    node: str
    kind: str  # an eviction kind (prewarm.domain.action_kinds.EVICT_KINDS): make_room, operator
    reason: str
    numbers: Mapping[str, float] = field(default_factory=dict)
    version: str = "1"


@dataclass(frozen=True, slots=True)
class Keep:
    """A decision to leave a replica as it is although a rule would change it (e.g. a refresh that found
    no room): nothing to dispatch; the caller logs the reason (live: a `keep` event)."""

    model: str
    gpu: str
    kind: str  # "refresh_blocked"
    reason: str
    numbers: Mapping[str, float] = field(default_factory=dict)
    version: str = "1"


Action = Preload | Evict | Stage | Unstage | Keep
