"""web.group_commit: concurrent callers share one write, each answered only after a write holding its counts
succeeded, and a failed write fails exactly the callers merged into it. Real threads, a write function that
holds its first call at a gate so the others arrive while it is in flight."""

from __future__ import annotations

import threading
import time

import pytest

from web.group_commit import GroupCommit


class GatedWrite:
    def __init__(self, fail_on: frozenset[int] = frozenset()) -> None:
        self.calls: list[dict] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.fail_on = fail_on

    def __call__(self, counts, now) -> None:  # noqa: ANN001
        i = len(self.calls)
        self.calls.append({ts: dict(pm) for ts, pm in counts.items()})
        if i == 0:
            self.entered.set()
            assert self.gate.wait(10)
        if i in self.fail_on:
            raise ConnectionError(f"write {i} failed")


def _run(gc: GroupCommit, counts: dict, out: dict, key: str) -> threading.Thread:
    def go() -> None:
        try:
            out[key] = gc.record(counts, 100.0)
        except ConnectionError as exc:
            out[key] = exc
    t = threading.Thread(target=go)
    t.start()
    return t


def _wait_merged(gc: GroupCommit, expect: dict) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with gc._cond:
            if gc._pending is not None and gc._pending.counts == expect:
                return
        time.sleep(0.005)
    raise AssertionError(f"the callers never merged into {expect}")


def test_callers_arriving_during_a_write_share_the_next_one() -> None:
    write = GatedWrite()
    gc = GroupCommit(write)
    out: dict = {}
    first = _run(gc, {1.0: {"a": 2}}, out, "first")
    assert write.entered.wait(10)
    late = [_run(gc, {1.0: {"a": 1}, 2.0: {"b": 3}}, out, "b"), _run(gc, {1.0: {"a": 4}}, out, "c"),
            _run(gc, {2.0: {"c": 1, "b": 1}}, out, "d")]
    _wait_merged(gc, {1.0: {"a": 5}, 2.0: {"b": 4, "c": 1}})
    assert not out  # nobody is answered before a write holding its counts is done
    write.gate.set()
    for t in [first, *late]:
        t.join(10)
    assert write.calls == [{1.0: {"a": 2}}, {1.0: {"a": 5}, 2.0: {"b": 4, "c": 1}}]  # two writes for four callers
    assert out == {"first": 2, "b": 4, "c": 4, "d": 2}  # each its own requests


def test_a_failed_write_fails_exactly_the_callers_it_held_and_the_next_write_goes_on() -> None:
    write = GatedWrite(fail_on=frozenset({1}))
    gc = GroupCommit(write)
    out: dict = {}
    first = _run(gc, {1.0: {"a": 1}}, out, "first")
    assert write.entered.wait(10)
    late = [_run(gc, {1.0: {"a": 1}}, out, "b"), _run(gc, {1.0: {"b": 1}}, out, "c")]
    _wait_merged(gc, {1.0: {"a": 1, "b": 1}})
    write.gate.set()
    for t in [first, *late]:
        t.join(10)
    assert out["first"] == 1
    assert isinstance(out["b"], ConnectionError) and out["b"] is out["c"]  # the one write that held both
    assert gc.record({3.0: {"a": 7}}, 100.0) == 7  # not stuck: the next caller writes at once
    assert write.calls[-1] == {3.0: {"a": 7}} and len(write.calls) == 3


def test_a_caller_alone_writes_at_once() -> None:
    calls: list[dict] = []
    gc = GroupCommit(lambda counts, now: calls.append(dict(counts)))
    assert [gc.record({float(i): {"a": i}}, 0.0) for i in range(3)] == [0, 1, 2]
    assert calls == [{0.0: {"a": 0}}, {1.0: {"a": 1}}, {2.0: {"a": 2}}]


def test_the_write_gets_the_newest_now_of_its_callers() -> None:
    seen: list[float] = []
    write = GatedWrite()
    gc = GroupCommit(lambda counts, now: (seen.append(now), write(counts, now)))
    out: dict = {}
    t1 = threading.Thread(target=lambda: out.setdefault("a", gc.record({1.0: {"a": 1}}, 5.0)))
    t1.start()
    assert write.entered.wait(10)
    ts = [threading.Thread(target=lambda n=n: out.setdefault(str(n), gc.record({1.0: {"a": 1}}, n)))
          for n in (9.0, 7.0)]
    for t in ts:
        t.start()
    _wait_merged(gc, {1.0: {"a": 2}})
    write.gate.set()
    for t in [t1, *ts]:
        t.join(10)
    assert seen == [5.0, 9.0]


@pytest.mark.parametrize("n", [1, 2])
def test_record_returns_the_requests_of_its_own_counts(n: int) -> None:
    gc = GroupCommit(lambda counts, now: None)
    assert gc.record({1.0: {"a": n, "b": 0}, 2.0: {"a": 1}}, 0.0) == n + 1
