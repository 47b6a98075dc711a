"""Catalog `priority` and `max_replica_age` (issue 14, items 3 and 6): defaults, values, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from prewarm import priority as priorities
from prewarm.catalog import load_catalog
from prewarm.catalog_entries import CatalogError
from tests.model_files import tiny_catalog


@pytest.fixture
def cat(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "m", ["tiny-lm", "tiny-sharded"])


def _add(path: Path, lines: str) -> None:
    """Add `lines` to the first entry (tiny-lm), after its version."""
    text = path.read_text()
    assert 'version = "v1"' in text
    path.write_text(text.replace('version = "v1"', f'version = "v1"\n{lines}', 1))


def test_defaults_normal_and_no_age_limit(cat: Path) -> None:
    c = load_catalog(cat)
    e = c.get("tiny-lm")
    assert e.priority == "normal" and e.max_replica_age_s is None
    assert e.summary()["priority"] == "normal" and e.summary()["max_replica_age_s"] is None


@pytest.mark.parametrize(("raw", "seconds"), [('"6h"', 21600.0), ('"30m"', 1800.0), ('"90s"', 90.0),
                                              ("45", 45.0), ('"2.5m"', 150.0)])
def test_max_replica_age_durations(cat: Path, raw: str, seconds: float) -> None:
    _add(cat, f'priority = "high"\nmax_replica_age = {raw}')
    e = load_catalog(cat).get("tiny-lm")
    assert e.priority == "high" and e.max_replica_age_s == seconds
    assert e.summary()["max_replica_age_s"] == seconds and e.summary()["priority"] == "high"
    assert load_catalog(cat).get("tiny-sharded").priority == "normal"  # only the entry that says so


@pytest.mark.parametrize(("line", "needle"), [
    ('priority = "urgent"', "model 'tiny-lm': priority 'urgent' must be one of low, normal, high"),
    ("priority = 2", "model 'tiny-lm': priority 2 must be one of low, normal, high"),
    ('priority = "HIGH"', "model 'tiny-lm': priority 'HIGH' must be one of low, normal, high"),
    ('max_replica_age = "6 hours"', "model 'tiny-lm': max_replica_age '6 hours' must be a duration"),
    ('max_replica_age = "-5m"', "model 'tiny-lm': max_replica_age '-5m' must be a duration"),
    ("max_replica_age = true", "model 'tiny-lm': max_replica_age True must be a duration"),
    ('max_replica_age = "0s"', "model 'tiny-lm': max_replica_age must be a duration between 1 s and 365 days, got '0s'"),
])
def test_bad_values_name_the_model_and_the_allowed_values(cat: Path, line: str, needle: str) -> None:
    _add(cat, line)
    with pytest.raises(CatalogError) as info:
        load_catalog(cat)
    assert needle in str(info.value) and str(cat) in str(info.value)


def test_lenient_load_leaves_only_the_bad_entry_out(cat: Path) -> None:
    _add(cat, 'priority = "urgent"')
    c = load_catalog(cat, strict=False)
    assert c.ids() == ["tiny-sharded"] and "priority 'urgent'" in c.problems["tiny-lm"]


def test_priority_ranks() -> None:
    assert [priorities.rank(x) for x in priorities.LEVELS] == [0, 1, 2]
    assert priorities.rank(None) == priorities.rank("normal")  # a message from before priorities
    with pytest.raises(ValueError, match="priority 'x' is not one of low, normal, high"):
        priorities.check("x", "priority")


def test_eta_queue_order_follows_the_worker_high_first() -> None:
    """One slot, 10 s left on its load; a normal load queued first and a high one after: the high one is
    ready at 10 + 5, the normal one after it (as the worker orders them)."""
    from prewarm.eta import Waiting, queue_etas

    waiting = [Waiting("a", "v1", (0, -priorities.rank(None), 1.0), 5.0),
               Waiting("b", "v1", (0, -priorities.rank("high"), 2.0), 5.0),
               Waiting("c", "v1", (1, -priorities.rank(None), 0.5), 5.0)]  # dispatched, not seen yet: last
    assert queue_etas([10.0], waiting, 1) == {("b", "v1"): 15.0, ("a", "v1"): 20.0, ("c", "v1"): 25.0}
