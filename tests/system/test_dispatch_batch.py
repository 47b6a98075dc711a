"""The dispatcher's batches (`Dispatcher.send_many`, what the scheduler's tick sends) against a real Redis and
a real Celery broker with no worker consuming: the tasks wait in the GPUs' queues, where the test reads them.

A batch sends exactly its claimed actions, records every intent, event, count and load kind, costs the same
few round trips whatever its size, and a publish that fails loses nothing of the others and leaves no
intent behind.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from prewarm import celery_app, events, keys, state
from prewarm.dispatch import Dispatched, Dispatcher, Order
from prewarm.redis_round_trips import count_round_trips
from prewarm.store import dispatch_counts, load_kinds

GIB = 1024**3


class RefusingBroker(Celery):
    """A real Celery app whose publish of one model's tasks fails, as a broker refusing one message
    would: every other task goes to the real broker."""

    refuse = "bad"

    def send_task(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        if args and args[0] == self.refuse:
            raise ConnectionError(f"the broker refused the task for {self.refuse}")
        return super().send_task(name, args=args, kwargs=kwargs, **options)


def refusing_broker(redis_url: str) -> RefusingBroker:
    app = RefusingBroker("prewarm", broker=redis_url, backend=redis_url)
    app.conf.update(task_serializer="json", accept_content=["json"], task_send_sent_event=True)
    return app


@pytest.fixture
def celery(redis_url: str) -> Iterator[Celery]:
    app = celery_app.make_celery(redis_url)
    yield app
    app.close()


def gpu(node: str, device: str) -> state.Gpu:
    return state.Gpu(id=state.gpu_id(node, device), node=node, device=device, queue=state.queue_name(node, device),
                     total_bytes=80 * GIB, used_bytes=0, free_bytes=80 * GIB, last_heartbeat=time.time())


def queued(r: redis.Redis, g: state.Gpu) -> list[dict[str, Any]]:
    """The Celery messages waiting in a GPU's queue (kombu's Redis transport keeps a list per queue)."""
    return [json.loads(m)["headers"] for m in r.lrange(g.queue, 0, -1)]


def intent(r: redis.Redis, model: str, target: str) -> dict[str, Any] | None:
    raw = r.get(keys.intent(model, target))
    return json.loads(raw) if raw else None


def test_a_batch_sends_exactly_its_actions_and_records_each(r: redis.Redis, celery: Celery) -> None:
    a, b = gpu("node-a", "cuda:0"), gpu("node-b", "cuda:0")
    d = Dispatcher(r, celery)
    assert d.preload("held", "v1", b, actor="operator", reason="by hand", kind="operator").sent
    orders = [
        Order("preload", "m1", "v1", a, "scheduler", "demand now", {"rate": 1.5}, "demand"),
        Order("preload", "m2", "v1", b, "scheduler", "likely soon", None, "speculative"),
        Order("evict", "m2", "v1", b, "scheduler", "room for m1", None, "victim"),  # takes over m2's preload
        Order("stage", "m3", "v1", a, "scheduler", "keep on host", None, "evicted", 0.25),
        Order("preload", "held", "v1", b, "scheduler", "again", None, "demand"),  # refused: in flight
        Order("unstage", "m4", "v1", b, "scheduler", "quiet", None, "quiet"),
    ]
    answers = d.send_many(orders)
    assert all(isinstance(x, Dispatched) for x in answers)
    assert [x.sent for x in answers if isinstance(x, Dispatched)] == [True, True, True, True, False, True]
    refused = answers[4]
    assert isinstance(refused, Dispatched) and refused.held is not None and refused.held.actor == "operator"
    evict = answers[2]
    assert isinstance(evict, Dispatched) and evict.superseded and evict.held is not None
    assert evict.held.id == answers[1].intent_id  # type: ignore[union-attr]

    # Exactly the sent tasks wait in the queues, each carrying its intent.
    on_a = {h["id"]: h for h in queued(r, a)}
    on_b = {h["id"]: h for h in queued(r, b)}
    assert set(on_a) == {answers[0].task_id, answers[3].task_id}  # type: ignore[union-attr]
    assert set(on_b) - {answers[1].task_id, answers[2].task_id, answers[5].task_id} == {  # type: ignore[union-attr]
        next(h["id"] for h in on_b.values() if "'held'" in h["argsrepr"])}  # the operator's, sent before
    assert on_a[answers[3].task_id]["task"] == celery_app.STAGE  # type: ignore[union-attr]
    assert "'supersedes'" in on_b[evict.task_id]["kwargsrepr"]

    # One intent per (model, target): the evict's replaced the preload's; stage/unstage on the node's host.
    assert intent(r, "m1", a.id)["id"] == answers[0].intent_id  # type: ignore[index,union-attr]
    assert intent(r, "m2", b.id)["action"] == "evict"  # type: ignore[index]
    assert intent(r, "m3", state.host_id("node-a"))["action"] == "stage"  # type: ignore[index]
    assert intent(r, "m4", state.host_id("node-b"))["action"] == "unstage"  # type: ignore[index]
    assert intent(r, "held", b.id)["actor"] == "operator"  # type: ignore[index]

    # One event per sent action, in order, with who and why; the counts and load kinds of each.
    log = [e for e in reversed(events.read(r, limit=50)) if e.actor == "scheduler"]
    assert [(e.kind, e.model, e.gpu) for e in log] == [
        ("preload", "m1", a.id), ("preload", "m2", b.id), ("evict", "m2", b.id),
        ("stage", "m3", state.host_id("node-a")), ("unstage", "m4", state.host_id("node-b"))]
    assert log[0].numbers == {"rate": 1.5, "kind": "demand"}
    assert log[2].numbers["supersedes"] == "preload"
    counts = dispatch_counts.read(r)
    assert counts[("preload", "demand")] == 1 and counts[("preload", "speculative")] == 1
    assert counts[("preload", "operator")] == 1 and counts[("evict", "victim")] == 1
    assert counts[("stage", "evicted")] == 1 and counts[("unstage", "quiet")] == 1
    kinds = load_kinds.read(r)
    assert kinds[load_kinds.field("m1", "v1", a.id)] == "scheduler:demand"
    assert kinds[load_kinds.field("held", "v1", b.id)] == "operator:operator"  # the refused one changed nothing


def test_a_batch_costs_the_same_round_trips_whatever_its_size(r: redis.Redis, celery: Celery) -> None:
    trips = count_round_trips(r)
    d = Dispatcher(r, celery)
    g = gpu("node-a", "cuda:0")
    d.send_many([Order("preload", "warm-up", "v1", g, "scheduler", "x")])  # connects
    for n in (1, 40):
        before = trips.value
        answers = d.send_many([Order("preload", f"n{n}-{i}", "v1", g, "scheduler", "x") for i in range(n)])
        assert all(isinstance(x, Dispatched) and x.sent for x in answers)
        assert trips.value - before == 2, n  # the claims, then the records: one pipeline each
    assert d.send_many([]) == []


def test_a_failed_publish_loses_no_other_record_and_leaves_no_intent(r: redis.Redis, redis_url: str) -> None:
    app = refusing_broker(redis_url)
    try:
        g = gpu("node-a", "cuda:0")
        d = Dispatcher(r, app)
        answers = d.send_many([Order("preload", m, "v1", g, "scheduler", "demand now", None, "demand")
                               for m in ("one", "bad", "two")])
        assert isinstance(answers[1], ConnectionError)
        one, two = answers[0], answers[2]
        assert isinstance(one, Dispatched) and one.sent and isinstance(two, Dispatched) and two.sent
        assert {h["id"] for h in queued(r, g)} == {one.task_id, two.task_id}
        assert intent(r, "bad", g.id) is None, "nothing was sent for it: its claim is released"
        assert intent(r, "one", g.id) is not None and intent(r, "two", g.id) is not None
        assert [e.model for e in reversed(events.read(r, limit=10))] == ["one", "two"]
        assert dispatch_counts.read(r) == {("preload", "demand"): 2}
        # One action alone (the route hook's, the CLI's) still raises, and leaves no claim either.
        with pytest.raises(ConnectionError):
            d.preload("bad", "v1", g, actor="router", reason="cold lookup")
        assert intent(r, "bad", g.id) is None
        assert d.preload("bad-not", "v1", g, actor="router", reason="cold lookup").sent
    finally:
        app.close()


def test_an_unknown_action_is_refused_before_anything_is_claimed(r: redis.Redis, celery: Celery) -> None:
    g = gpu("node-a", "cuda:0")
    with pytest.raises(ValueError, match="unknown action 'reload'"):
        Dispatcher(r, celery).send_many([Order("preload", "m1", "v1", g, "scheduler", "x"),
                                         Order("reload", "m2", "v1", g, "scheduler", "x")])
    assert not r.keys(keys.INTENT_PATTERN) and not r.exists(keys.EVENTS)


def test_every_task_of_a_batch_sends_its_task_sent_event(r: redis.Redis, celery: Celery) -> None:
    """Flower and `celery events` see each batched task as sent (the event goes out in the same batch)."""
    sub = r.pubsub()
    sub.psubscribe("*celeryev/task.sent*")
    assert sub.get_message(timeout=5)["type"] == "psubscribe"
    g = gpu("node-a", "cuda:0")
    answers = Dispatcher(r, celery).send_many([Order("preload", f"m{i}", "v1", g, "scheduler", "x", result=False)
                                               for i in range(3)])
    ids = set()
    deadline = time.time() + 10
    while len(ids) < 3 and time.time() < deadline:
        m = sub.get_message(timeout=1)
        if m and m["type"] == "pmessage":
            ids.add(_event_uuid(m["data"]))
    assert ids == {a.task_id for a in answers if isinstance(a, Dispatched)}
    assert not r.keys("celery-task-meta-*")  # result=False: no result record is kept for them
    sub.close()


def _event_uuid(raw: bytes) -> str:
    """The task id a Celery event message carries (kombu's envelope, its body base64-encoded JSON)."""
    import base64

    m = json.loads(raw)
    body = base64.b64decode(m["body"]) if m["properties"].get("body_encoding") == "base64" else m["body"]
    return json.loads(body)["uuid"]


def test_with_the_broker_unreachable_nothing_is_left_claimed(r: redis.Redis) -> None:
    """Every order is answered with the broker's error, and no intent, event or count is left for any."""
    app = celery_app.make_celery("redis://127.0.0.1:1/0")  # nothing listens on port 1
    app.conf.broker_connection_retry = False
    app.conf.task_publish_retry = False
    try:
        g = gpu("node-a", "cuda:0")
        answers = Dispatcher(r, app).send_many([Order("preload", m, "v1", g, "scheduler", "x", result=False)
                                                for m in ("a", "b")])
        assert len(answers) == 2 and all(isinstance(a, Exception) for a in answers)
        assert not r.keys(keys.INTENT_PATTERN) and not r.exists(keys.EVENTS) and not dispatch_counts.read(r)
    finally:
        app.close()
