"""plan() and the host-memory staging tier (issue 4), on hand-built snapshots with an injected clock."""

from __future__ import annotations

from prewarm.domain.policy import (
    GIB,
    Evict,
    GpuState,
    ModelSpec,
    NodeState,
    PolicyConfig,
    Preload,
    ReplicaState,
    Snapshot,
    Stage,
    StagedState,
    TrafficHistory,
    Unstage,
    plan,
)

CFG = PolicyConfig()
NOW = 100_000.0


def history(arrivals: dict[str, list[float]]) -> TrafficHistory:
    h = TrafficHistory.for_config(CFG)
    for t, m in sorted((t, m) for m, ts in arrivals.items() for t in ts):
        h.add(m, t)
    return h


def gpu(node: str, total: int = 10 * GIB, used: int = 0) -> GpuState:
    return GpuState(f"{node}/cuda:0", node, total, total - used, joined_at=-1e9)


def spec(m: str, gib: float, load_s: float = 10.0) -> ModelSpec:
    return ModelSpec(m, int(gib * GIB), load_seconds=load_s)


def ready(m: str, g: str, gib: float) -> ReplicaState:
    return ReplicaState(m, g, "ready", int(gib * GIB), since=NOW - 5000, last_request=NOW - 3000)


def staged(m: str, node: str, gib: float) -> StagedState:
    return StagedState(m, node, "staged", int(gib * GIB), since=NOW - 4000)


def test_a_model_evicted_to_make_room_is_kept_in_host_memory() -> None:
    models = {"old": spec("old", 6), "new": spec("new", 6)}
    snap = Snapshot(models, (gpu("node-a", used=6 * GIB),), (ready("old", "node-a/cuda:0", 6),),
                    history({"old": [NOW - 3000 - 600 * i for i in range(5)], "new": [NOW - 1]}),
                    nodes=(NodeState("node-a", 20 * GIB, 20 * GIB),))
    actions = plan(snap, NOW)
    kinds = [(type(a).__name__, a.model) for a in actions]
    assert kinds == [("Evict", "old"), ("Preload", "new"), ("Stage", "old")]
    st = actions[2]
    assert isinstance(st, Stage)
    assert st.node == "node-a" and st.kind == "demote" and st.bytes == 6 * GIB and st.value > 0
    assert "host cache" in st.reason


def test_no_staging_tier_means_no_stage_actions() -> None:
    models = {"old": spec("old", 6), "new": spec("new", 6)}
    snap = Snapshot(models, (gpu("node-a", used=6 * GIB),), (ready("old", "node-a/cuda:0", 6),),
                    history({"old": [NOW - 3000 - 600 * i for i in range(5)], "new": [NOW - 1]}))
    assert [type(a) for a in plan(snap, NOW)] == [Evict, Preload]


def test_a_stage_that_does_not_fit_is_not_planned() -> None:
    models = {"old": spec("old", 6), "new": spec("new", 6)}
    snap = Snapshot(models, (gpu("node-a", used=6 * GIB),), (ready("old", "node-a/cuda:0", 6),),
                    history({"old": [NOW - 3000 - 600 * i for i in range(5)], "new": [NOW - 1]}),
                    nodes=(NodeState("node-a", 4 * GIB, 4 * GIB),))
    assert [type(a) for a in plan(snap, NOW)] == [Evict, Preload]
    # a cache big enough in budget but with only 4 GiB free and nothing staged to replace
    tight = Snapshot(models, (gpu("node-a", used=6 * GIB),), (ready("old", "node-a/cuda:0", 6),),
                     history({"old": [NOW - 3000 - 600 * i for i in range(5)], "new": [NOW - 1]}),
                     nodes=(NodeState("node-a", 20 * GIB, 4 * GIB),))
    assert [type(a) for a in plan(tight, NOW)] == [Evict, Preload]


def test_a_staged_model_is_promoted_on_the_node_that_holds_it() -> None:
    models = {"m": spec("m", 4, load_s=30.0)}
    gpus = (gpu("node-a"), gpu("node-b"))
    snap = Snapshot(models, gpus, (), history({"m": [NOW - 7200, NOW - 1]}),
                    nodes=(NodeState("node-a", 20 * GIB, 20 * GIB), NodeState("node-b", 20 * GIB, 16 * GIB)),
                    staged=(staged("m", "node-b", 4),))
    actions = plan(snap, NOW)
    assert [(type(a), a.gpu) for a in actions] == [(Preload, "node-b/cuda:0")]
    assert "promoted from node-b's host cache" in actions[0].reason
    assert actions[0].numbers["from_host"] == 1.0
    # the same snapshot without the staged copy: the first GPU by id
    plain = Snapshot(models, gpus, (), history({"m": [NOW - 7200, NOW - 1]}),
                     nodes=(NodeState("node-a", 20 * GIB, 20 * GIB), NodeState("node-b", 20 * GIB, 20 * GIB)))
    assert [a.gpu for a in plan(plain, NOW)] == ["node-a/cuda:0"]


def test_a_staged_replica_is_the_cheaper_victim() -> None:
    # Two residents with identical bursty traffic (5 requests per active minute: a slow reload
    # turns the burst cold); only one has a copy in host memory, so evicting it costs a short
    # promotion on its return, not a 60 s storage load: it goes first.
    models = {"a": spec("a", 4, load_s=60.0), "b": spec("b", 4, load_s=60.0), "new": spec("new", 4)}
    reps = (ready("a", "node-a/cuda:0", 4), ready("b", "node-a/cuda:0", 4))
    burst = [NOW - 3000 - 300 * i + 10 * j for i in range(20) for j in range(5)]
    arrivals = {"a": burst, "b": burst, "new": [NOW - 1]}
    base = dict(models=models, gpus=(gpu("node-a", total=10 * GIB, used=8 * GIB),), replicas=reps)
    staged_b = Snapshot(**base, traffic=history(arrivals), nodes=(NodeState("node-a", 20 * GIB, 16 * GIB),),
                        staged=(staged("b", "node-a", 4),))
    evicted = [a.model for a in plan(staged_b, NOW) if isinstance(a, Evict)]
    assert evicted == ["b"]
    staged_a = Snapshot(**base, traffic=history(arrivals), nodes=(NodeState("node-a", 20 * GIB, 16 * GIB),),
                        staged=(staged("a", "node-a", 4),))
    assert [a.model for a in plan(staged_a, NOW) if isinstance(a, Evict)] == ["a"]


def test_a_full_host_cache_replaces_only_what_is_worth_less() -> None:
    # "cold" in host memory has not been asked for in a day; the evicted "old" is worth more per byte.
    models = {"old": spec("old", 6), "new": spec("new", 6), "cold": spec("cold", 8)}
    arrivals = {"old": [NOW - 3000 - 600 * i for i in range(5)], "new": [NOW - 1], "cold": [NOW - 86_000]}
    snap = Snapshot(models, (gpu("node-a", used=6 * GIB),), (ready("old", "node-a/cuda:0", 6),),
                    history(arrivals), nodes=(NodeState("node-a", 10 * GIB, 2 * GIB),),
                    staged=(staged("cold", "node-a", 8),))
    actions = plan(snap, NOW)
    assert [(type(a), a.model) for a in actions] == [(Evict, "old"), (Preload, "new"), (Unstage, "cold"),
                                                    (Stage, "old")]
    assert actions[2].kind == "make_room" and actions[2].node == "node-a"
    # the other way round: a staged model worth more than the candidate stays
    arrivals2 = {"old": [NOW - 80_000], "new": [NOW - 1], "cold": [NOW - 3000 - 300 * i for i in range(30)]}
    snap2 = Snapshot(models, (gpu("node-a", used=6 * GIB),), (ready("old", "node-a/cuda:0", 6),),
                     history(arrivals2), nodes=(NodeState("node-a", 10 * GIB, 2 * GIB),),
                     staged=(staged("cold", "node-a", 8),))
    assert [type(a) for a in plan(snap2, NOW)] == [Evict, Preload]


def test_stages_in_flight_are_bounded_per_node() -> None:
    cfg = PolicyConfig(max_stages_per_node=1)
    models = {"old": spec("old", 6), "new": spec("new", 6), "x": spec("x", 1)}
    snap = Snapshot(models, (gpu("node-a", used=6 * GIB),), (ready("old", "node-a/cuda:0", 6),),
                    history({"old": [NOW - 3000 - 600 * i for i in range(5)], "new": [NOW - 1], "x": [NOW - 50]}),
                    nodes=(NodeState("node-a", 20 * GIB, 19 * GIB),),
                    staged=(StagedState("x", "node-a", "staging", 1 * GIB, NOW - 1),), config=cfg)
    assert [type(a) for a in plan(snap, NOW)] == [Evict, Preload]
