"""The simulator carries the catalog's priority and max_replica_age from optional profile columns
(issue 14, items 3 and 6): its load-slot queue starts the highest priority first, as the worker does.
Figures worked out by hand in the comments."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulator.engine import Simulation
from simulator.policies import POLICIES
from simulator.trace import GIB, load_profile_fields

from .test_sim import trace

FOUR = [(0.0, "A"), (1.0, "B"), (2.0, "C"), (3.0, "D")]


def _sim(priority: dict[str, int] | None) -> Simulation:
    tr = trace(FOUR, None)
    sizes = np.array([GIB] * len(tr.models), dtype=np.int64)
    loads = np.array([10.0] * len(tr.models))
    prio = None if priority is None else [priority.get(m, 1) for m in tr.models]
    return Simulation(tr, sizes, loads, 1, 8 * GIB, "shared", load_slots=1, priority=prio)


def test_a_high_priority_load_queued_last_takes_the_next_slot() -> None:
    # One slot: A loads 0-10. B, C and D queue behind it; D is high: 10-20, then B 20-30, C 30-40.
    # Waits, in the order the loads end: A 10, D 20 − 3 = 17, B 30 − 1 = 29, C 40 − 2 = 38.
    sim = _sim({"D": 2})
    sim.run(POLICIES["on-demand-lru"]())
    assert sim.waits == pytest.approx([10.0, 17.0, 29.0, 38.0])


def test_equal_priorities_keep_the_queue_fifo() -> None:
    # B 10-20, C 20-30, D 30-40: waits 10, 19, 28, 37 (D: 40 − 3) — the same with every model normal as with none given
    for prio in (None, {}):
        sim = _sim(prio)
        sim.run(POLICIES["on-demand-lru"]())
        assert sim.waits == pytest.approx([10.0, 19.0, 28.0, 37.0])


def test_profile_fields(tmp_path: Path) -> None:
    p = tmp_path / "profile.csv"
    p.write_text("model,size_bytes,load_seconds,priority,max_replica_age\n"
                 "a,100,1.0,high,6h\nb,100,1.0,,\nc,100,1.0,low,90s\n")
    assert load_profile_fields(p, ["a", "b", "c", "d"]) == ([2, 1, 0, 1], [21600.0, None, 90.0, None])
    plain = tmp_path / "plain.csv"
    plain.write_text("model,size_bytes,load_seconds\na,100,1.0\n")
    assert load_profile_fields(plain, ["a"]) == ([1], [None])
    assert load_profile_fields(None, ["a"]) == ([1], [None])
    p.write_text("model,size_bytes,load_seconds,priority\na,100,1.0,urgent\n")
    with pytest.raises(ValueError, match="model 'a': priority 'urgent' is not one of low, normal, high"):
        load_profile_fields(p, ["a"])
    for age in ("soon", "0.5s", "9000h"):  # read as the catalog reads it: 1 s to 365 days (0.5s was taken)
        p.write_text(f"model,size_bytes,load_seconds,max_replica_age\na,100,1.0,{age}\n")
        with pytest.raises(ValueError, match=f"max_replica_age '{age}' is not a duration such as 90s, 30m or 6h, "
                                             "from 1 s to 365 days"):
            load_profile_fields(p, ["a"])
