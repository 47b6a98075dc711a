"""The one placement rule (prewarm.domain.policy.placement.rank), on hand-made rooms with hand-computed
orders; every caller (planner, route hook, CLI, API) chooses through it."""

from __future__ import annotations

from prewarm.domain.policy.placement import Room, rank

MIB = 1 << 20


def _ids(rooms: list[Room]) -> list[str]:
    return [r.gpu for r in rooms]


def test_tightest_fit_first_among_idle_gpus() -> None:
    # a 3 MiB model: leftovers 7, 1, 0 and 2 MiB; d (2 MiB free) cannot take it
    rooms = [Room("a", "n1", 10 * MIB, 0), Room("b", "n1", 4 * MIB, 0), Room("c", "n2", 3 * MIB, 0),
             Room("d", "n2", 2 * MIB, 0), Room("e", "n3", 5 * MIB, 0)]
    assert _ids(rank(rooms, 3 * MIB)) == ["c", "b", "e", "a"]


def test_a_staged_node_then_a_free_slot_then_fewer_loads_come_before_the_fit() -> None:
    rooms = [Room("a", "n1", 4 * MIB, 0),   # tightest fit, idle link
             Room("b", "n2", 60 * MIB, 1),  # the model is staged on n2, one load running
             Room("c", "n3", 5 * MIB, 2),   # both slots taken (max_loads 2): last
             Room("d", "n4", 30 * MIB, 1),  # one load running
             Room("e", "n2", 8 * MIB, 2)]   # staged node, but its slots are taken
    assert _ids(rank(rooms, 4 * MIB, staged={"n2"}, max_loads=2)) == ["b", "e", "a", "d", "c"]
    # without a load limit, a full GPU is only later for its number of loads
    assert _ids(rank(rooms, 4 * MIB, staged={"n2"})) == ["b", "e", "a", "d", "c"]
    assert _ids(rank(rooms, 4 * MIB, max_loads=2)) == ["a", "d", "b", "c", "e"]


def test_exclusions_and_ties() -> None:
    rooms = [Room("b", "n1", 6 * MIB, 0), Room("a", "n1", 6 * MIB, 0), Room("c", "n2", 6 * MIB, 0)]
    assert _ids(rank(rooms, MIB)) == ["a", "b", "c"]  # equal in every way: by id
    assert _ids(rank(rooms, MIB, exclude={"a", "c"})) == ["b"]
    assert rank(rooms, 7 * MIB) == [] and rank([], MIB) == []
    assert _ids(rank(rooms, 6 * MIB)) == ["a", "b", "c"]  # an exact fit is a fit


def test_with_no_room_anywhere_the_roomiest_gpu_is_the_fallback() -> None:
    from prewarm.domain.policy.placement import roomiest
    rooms = [Room("a", "n1", 2 * MIB, 0), Room("b", "n1", 5 * MIB, 1), Room("c", "n2", 5 * MIB, 0)]
    assert rank(rooms, 6 * MIB) == []
    assert roomiest(rooms) == rooms[2]  # most free memory; the tie goes to the last id
    assert roomiest([]) is None


def test_a_baseline_with_room_chooses_as_rank_and_otherwise_by_its_eviction_order() -> None:
    from dataclasses import dataclass, field

    from prewarm.domain.baselines.placement import choose

    @dataclass
    class Rep:
        model: int
        bytes: int
        state: str = "ready"

    @dataclass
    class G:
        index: int
        capacity: int
        residents: dict = field(default_factory=dict)

    gpus = [G(0, 10 * MIB, {1: Rep(1, 6 * MIB)}), G(1, 10 * MIB, {2: Rep(2, 2 * MIB), 3: Rep(3, 2 * MIB)})]
    free = {0: 4 * MIB, 1: 6 * MIB}
    # 3 MiB fits both: rank's tightest fit is GPU 0 (1 MiB left against 3), no victims
    assert choose(gpus, 9, 3 * MIB, lambda r: r.model, None, free.__getitem__, lambda i: 0, 2) == (0, [])
    # ...unless GPU 0's slots are taken
    assert choose(gpus, 9, 3 * MIB, lambda r: r.model, None, free.__getitem__, lambda i: 2 - 2 * i, 2) == (1, [])
    # 7 MiB fits nowhere: victims by key; GPU 1 frees 2 MiB with model 2 (largest key 2) against GPU 0's 1
    # (key 1): GPU 0 is the closest to evicting in the global order
    gi, victims = choose(gpus, 9, 7 * MIB, lambda r: r.model, None, free.__getitem__, lambda i: 0, 2)
    assert gi == 0 and [v.model for v in victims] == [1]
