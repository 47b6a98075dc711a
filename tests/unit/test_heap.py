"""prewarm.heap: the scheduler process's collector, settled once per snapshot reader."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from prewarm.heap import YOUNG_PASS_ALLOCATIONS, Heap


class Reader:  # stands for a SnapshotReader: any object the heap can hold a weak reference to
    pass


@pytest.fixture
def interpreter_gc() -> Iterator[None]:
    """The test process's collector as it was, whatever a settle did."""
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_reader_is_settled_once_and_a_new_one_again(interpreter_gc: None) -> None:
    heap = Heap()
    assert heap.settle(None) is False and gc.get_freeze_count() == 0  # no reader (not leading): nothing
    first = Reader()
    assert heap.settle(first) is True
    assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] == YOUNG_PASS_ALLOCATIONS
    assert heap.settle(first) is False  # every later tick of the same reader: nothing more
    second = Reader()  # a new lead: its records are settled after its first tick
    assert heap.settle(second) is True and heap.settles == 2
    del first
    assert heap.settle(second) is False


def test_a_settle_collects_garbage_first_and_the_last_readers_frozen_records_are_collected_again(
        interpreter_gc: None) -> None:
    heap = Heap()
    junk = Reader()
    junk.self = junk  # type: ignore[attr-defined]  # a cycle: only a collection frees it
    junk_ref = weakref.ref(junk)
    del junk
    old = Reader()
    old.records = Reader()  # type: ignore[attr-defined]
    old.records.owner = old  # type: ignore[attr-defined]  # the reader's records point back at it
    old_ref = weakref.ref(old)
    assert heap.settle(old) is True
    assert junk_ref() is None  # collected before the freeze, not frozen with the rest
    del old  # the lead is lost: the reader and its records are cyclic garbage, but frozen
    gc.collect()
    assert old_ref() is not None
    assert heap.settle(Reader()) is True  # the next reader's settle unfreezes first: the old one is collected
    assert old_ref() is None
