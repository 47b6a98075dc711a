"""state.Departure: a GPU someone waits on has left the fleet only once its heartbeat stays away for the grace."""

from __future__ import annotations

from prewarm import state


def gpu(alive: bool = True) -> state.Gpu:
    return state.Gpu(id="node-a/cpu:0", node="node-a", device="cpu:0", queue="q", total_bytes=1, used_bytes=0,
                     free_bytes=1, last_heartbeat=0.0, alive=alive)


def test_a_lapse_shorter_than_the_grace_is_not_a_departure_and_a_return_resets_it() -> None:
    now = [100.0]
    d = state.Departure("node-a/cpu:0", 10.0, clock=lambda: now[0])
    assert d.left(gpu()) is None
    assert d.left(None) is None  # the record expired: missing since 100
    now[0] = 109.0
    assert d.left(gpu(alive=False)) is None  # still within the grace
    assert d.left(gpu()) is None  # the beat came back
    now[0] = 115.0
    assert d.left(None) is None  # a new lapse starts a new grace, not the old one's
    now[0] = 124.9
    assert d.left(None) is None
    now[0] = 125.0
    why = d.left(None)
    assert why == "GPU node-a/cpu:0 left the fleet while waiting (no heartbeat for 10 s)"


def test_no_grace_ends_the_wait_at_the_first_missing_read() -> None:
    d = state.Departure("node-a/cpu:0", 0.0, clock=lambda: 5.0)
    assert d.left(gpu()) is None
    assert d.left(None) is not None
