"""The tentative fleet of one plan() call: bytes, loads and replicas per GPU, staged models per node,
as the snapshot shows them plus the unconfirmed intents, updated by each action the call takes."""

from __future__ import annotations

from prewarm.domain.states import EVICTING, HOLDING, IN_FLIGHT, READY, STAGED

from .types import (
    GpuState,
    Intent,
    ModelSpec,
    ReplicaState,
    Snapshot,
    StagedState,
)


def intent_bytes(it: Intent, snap: Snapshot) -> int:
    """What a preload or stage in flight will hold: its own figure, else the catalog's size."""
    return it.bytes or (snap.models[it.model].size_bytes if it.model in snap.models else 0)


def ready_models(snap: Snapshot) -> set[str]:
    """The models with a ready replica in the snapshot: whether a request now is warm (whole.py reads it at every
    call; here, compiled with the policy, the scan is a struct read per replica)."""
    out: set[str] = set()
    for r in snap.replicas:
        if r.state == READY:
            out.add(r.model)
    return out


class _GpuSums:
    """One GPU's sums while Fleet.__init__ reads the replicas: one dict read per replica finds them all (natively,
    its fields are struct reads), and the per-GPU dicts are written once per GPU after the loop."""

    __slots__ = ("og", "lm", "used", "loading", "spec")

    def __init__(self, og: dict[str, ReplicaState], lm: list[str]) -> None:
        self.og = og
        self.lm = lm
        self.used = 0
        self.loading = 0
        self.spec = 0


class Fleet:
    """Tentative view of the fleet for one plan() call: what each GPU and host cache holds and will
    hold once this call's actions (and the unconfirmed intents before them) are done."""

    def __init__(self, snap: Snapshot, now: float) -> None:
        cfg = snap.config
        self.gpus: dict[str, GpuState] = {g.id: g for g in snap.gpus if g.alive}
        self.pending_intent: dict[str, int] = dict.fromkeys(self.gpus, 0)
        self.on_gpu: dict[str, dict[str, ReplicaState]] = {g: {} for g in self.gpus}
        self.of_model: dict[str, list[str]] = {}
        self.evicting: set[tuple[str, str]] = set()
        self.victims: dict[str, list[tuple[float, str, ReplicaState]]] = {}  # lazily sorted per gpu
        self.loading_models: dict[str, list[str]] = {g: [] for g in self.gpus}  # in the snapshot
        self.host_victims: dict[str, list[tuple[float, str, StagedState]]] = {}  # node -> staged, by value per byte
        traffic = snap.traffic
        of_model = self.of_model
        sums = {g: _GpuSums(self.on_gpu[g], self.loading_models[g]) for g in self.gpus}
        # the hot loop of every plan() call (hundreds of replicas): each attribute read once, READY (most
        # replicas) tested first
        for r in snap.replicas:
            st = r.state
            ready = st == READY
            if not ready and st not in HOLDING:
                continue
            g = r.gpu
            gs = sums.get(g)
            if gs is None:
                continue
            m = r.model
            size = r.bytes
            gs.used += size
            og = gs.og
            if not ready and st in IN_FLIGHT and m not in og:
                gs.lm.append(m)
            og[m] = r
            if st == EVICTING:
                self.evicting.add((m, g))
                continue
            gl = of_model.get(m)
            if gl is None:
                of_model[m] = [g]
            else:
                gl.append(g)
            if not ready:
                gs.loading += 1
            lr = r.last_request
            since = r.since
            if lr is None or lr < since:
                a = traffic.last_arrival(m)
                if a is None or a < since:
                    gs.spec += size
        # per live GPU (sums' keys, in self.gpus' order): bytes held, loads in flight, bytes loaded ahead unasked
        self.used: dict[str, int] = {g: gs.used for g, gs in sums.items()}
        self.loading: dict[str, int] = {g: gs.loading for g, gs in sums.items()}
        self.spec: dict[str, int] = {g: gs.spec for g, gs in sums.items()}
        for it in snap.intents:
            if it.gpu not in self.gpus or it.expires_at <= now:
                continue
            if it.kind == "evict":
                self.evicting.add((it.model, it.gpu))
            elif it.model not in self.on_gpu[it.gpu]:
                size = intent_bytes(it, snap)
                self.used[it.gpu] += size
                self.pending_intent[it.gpu] += size
                self.loading[it.gpu] += 1
                self.of_model.setdefault(it.model, []).append(it.gpu)
        # The staging tier: each live node's host cache (only nodes that still have a live GPU).
        gpu_nodes = {g.node for g in self.gpus.values()}
        self.nodes = {n.id: n for n in snap.nodes if n.alive and n.id in gpu_nodes}
        self.host_used: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.host_pending: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.stages_in_flight: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.on_host: dict[str, dict[str, StagedState | None]] = {n: {} for n in self.nodes}  # None: intent
        self.staged_nodes: dict[str, set[str]] = {}  # model -> nodes holding it ready to promote
        self.unstaging: set[tuple[str, str]] = set()
        for x in snap.staged:
            if x.node not in self.nodes:
                continue
            self.host_used[x.node] += x.bytes
            self.on_host[x.node][x.model] = x
            if x.state == STAGED:
                self.staged_nodes.setdefault(x.model, set()).add(x.node)
            else:
                self.stages_in_flight[x.node] += 1
        for it in snap.intents:
            if it.kind not in ("stage", "unstage") or it.gpu not in self.nodes or it.expires_at <= now:
                continue
            if it.kind == "unstage":
                self.unstaging.add((it.model, it.gpu))
            elif it.model not in self.on_host[it.gpu]:
                size = intent_bytes(it, snap)
                self.host_used[it.gpu] += size
                self.host_pending[it.gpu] += size
                self.stages_in_flight[it.gpu] += 1
                self.on_host[it.gpu][it.model] = None
        self.cfg = cfg

    def host_avail(self, node: str) -> int:
        n = self.nodes[node]
        return min(n.budget_bytes - self.host_used[node], n.free_bytes - self.host_pending[node])

    def avail(self, gpu: str) -> int:
        g = self.gpus[gpu]
        # the tighter of our accounting and the worker's measured free bytes (less what this
        # call and unconfirmed intents will load, plus what this call evicts)
        return min(g.total_bytes - self.used[gpu], g.free_bytes - self.pending_intent[gpu])

    def count(self, model: str) -> int:
        return len(self.of_model.get(model, ()))

    def ready(self, model: str) -> bool:
        """A replica of `model` is ready to serve (not loading, not leaving)."""
        for g in self.of_model.get(model, ()):
            r = self.on_gpu[g].get(model)
            if r is not None and r.state == READY:
                return True
        return False


    # ---- the tentative effect of this call's actions -----------------------------------------
    def evict(self, r: ReplicaState, speculative: bool) -> None:
        """r leaves its GPU (`speculative`: it counted against the GPU's speculative share); a load in flight
        is cancelled, and its share of the link goes too."""
        self.used[r.gpu] -= r.bytes
        self.pending_intent[r.gpu] -= r.bytes
        self.evicting.add((r.model, r.gpu))
        if r.state != READY:
            self.loading[r.gpu] -= 1
            lm = self.loading_models[r.gpu]
            if r.model in lm:
                lm.remove(r.model)
        gl = self.of_model.get(r.model, [])
        if r.gpu in gl:
            gl.remove(r.gpu)
        del self.on_gpu[r.gpu][r.model]
        if speculative:
            self.spec[r.gpu] -= r.bytes
        vl = self.victims.get(r.gpu)
        if vl is not None:
            self.victims[r.gpu] = [x for x in vl if x[2] is not r]

    def preload(self, spec: ModelSpec, gpu: str, speculative: bool) -> None:
        self.used[gpu] += spec.size_bytes
        self.pending_intent[gpu] += spec.size_bytes
        self.loading[gpu] += 1
        if speculative:
            self.spec[gpu] += spec.size_bytes
        self.of_model.setdefault(spec.id, []).append(gpu)  # a load is never a victim: orders stay valid

    def stage(self, spec: ModelSpec, node: str) -> None:
        self.host_used[node] += spec.size_bytes
        self.host_pending[node] += spec.size_bytes
        self.stages_in_flight[node] += 1
        self.on_host[node][spec.id] = None

    def unstage(self, x: StagedState) -> None:
        model, node = x.model, x.node
        self.host_used[node] -= x.bytes
        self.host_pending[node] -= x.bytes
        del self.on_host[node][model]
        self.unstaging.add((model, node))
        nodes = self.staged_nodes.get(model)
        if nodes is not None:
            nodes.discard(node)
            if not nodes:
                del self.staged_nodes[model]
        hv = self.host_victims.get(node)
        if hv is not None:
            self.host_victims[node] = [e for e in hv if e[1] != model]
