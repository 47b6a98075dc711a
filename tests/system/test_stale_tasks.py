"""Tasks delivered after their intent expired or was superseded are dropped by a real worker (issue 17,
finding 4): with acks_late, a task whose worker died unacknowledged comes back from the broker when its
visibility timeout lapses (an hour), long after anybody wanted it.

Here the tasks wait in the real broker while their worker is frozen (SIGSTOP: it consumes nothing, as a
dead one would not); by the time it resumes, their intents have expired or another action holds them.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from prewarm import celery_app, events, keys, state
from prewarm.dispatch import Dispatcher
from tests import procs
from tests.model_files import tiny_catalog
from tests.procs import wait_for
from tests.system.test_worker_process import gpu, rep, size_of

worker_factory = procs.worker_factory  # the fixture, used by name

MIB = 2**20


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "models", ["tiny-lm", "tiny-mlp", "tiny-sharded"])


@pytest.fixture
def celery(redis_url: str) -> Iterator[Celery]:
    app = celery_app.make_celery(redis_url)
    yield app
    app.close()


def _failure(celery: Celery, task_id: str) -> str:
    with pytest.raises(Exception) as info:  # noqa: PT011 - the worker's Stale, rebuilt by Celery
        celery.AsyncResult(task_id).get(timeout=60)
    return str(info.value)


def test_expired_and_superseded_tasks_are_dropped_as_stale(r: redis.Redis, celery: Celery, catalog: Path,
                                                           worker_factory) -> None:
    gid = "node-a/cpu:0"
    w = worker_factory(catalog, devices="cpu:0=64MiB", heartbeat_ttl=120)  # stays in the fleet while frozen
    g = gpu(r, gid)
    os.kill(w.pid, signal.SIGSTOP)
    try:
        # 1. Its intent expires while the task waits.
        expired = Dispatcher(r, celery, intent_ttl=0.5).preload("tiny-mlp", "v1", g, actor="scheduler", reason="t")
        assert expired.sent
        wait_for(lambda: not r.exists(keys.intent("tiny-mlp", gid)), 10, what="the intent to expire")
        # 2. Its intent is cleared before its deadline (as a restarting worker clears its GPU's), and the
        #    model is dispatched again: another intent id is held now.
        # A long TTL for the rest: on a busy machine the default one could lapse before the worker resumes,
        # and these must be dropped for being superseded, not for having expired.
        held = Dispatcher(r, celery, intent_ttl=3600)
        first = held.preload("tiny-lm", "v1", g, actor="scheduler", reason="first")
        assert state.release_intent(r, "tiny-lm", gid, first.intent_id)
        second = held.preload("tiny-lm", "v1", g, actor="scheduler", reason="second")
        assert first.sent and second.sent and first.intent_id != second.intent_id
        # 3. An evict supersedes a preload that has not started: that preload must never load.
        pre = held.preload("tiny-sharded", "v1", g, actor="operator", reason="t")
        ev = held.evict("tiny-sharded", "v1", g, actor="operator", reason="changed my mind")
        assert pre.sent and ev.sent and ev.superseded and ev.held is not None and ev.held.id == pre.intent_id
    finally:
        os.kill(w.pid, signal.SIGCONT)

    # Not cleared by the starting worker: its intents are gone or not theirs, whatever the worker does.
    assert "dropped as stale: its intent expired" in _failure(celery, expired.task_id)
    assert "dropped as stale: superseded by the preload of tiny-lm@v1" in _failure(celery, first.task_id)
    # Whichever of the two runs first (the worker has several threads), the preload is dropped for the evict.
    assert re.search(r"dropped as stale: superseded by (the|an) evict", _failure(celery, pre.task_id))
    # The live ones run: the second preload loads tiny-lm, the evict finds nothing to evict.
    assert celery.AsyncResult(second.task_id).get(timeout=60)["state"] == "ready"
    assert celery.AsyncResult(ev.task_id).get(timeout=60)["noop"]

    stale = events.read(r, kind="stale")
    assert sorted(e.model for e in stale) == ["tiny-lm", "tiny-mlp", "tiny-sharded"]
    assert all(e.actor == "worker" and e.gpu == gid and e.numbers["action"] == "preload" for e in stale)
    assert {e.numbers["intent_id"] for e in stale} == {expired.intent_id, first.intent_id, pre.intent_id}
    # Nothing else happened: one replica (the live preload's), its bytes alone counted, one load.
    assert [(x.model, x.state) for x in gpu(r, gid).replicas] == [("tiny-lm", "ready")]
    assert gpu(r, gid).used_bytes == size_of(catalog, "tiny-lm")
    assert [e.model for e in events.read(r, kind="ready")] == ["tiny-lm"]
    assert not list(r.scan_iter(match=keys.INTENT_PATTERN)), "the live tasks released their own intents"

    # An evict delivered after its intent's deadline leaves the replica alone.
    now = time.time()
    old = state.Intent("evict", "tiny-lm", "v1", gid, "scheduler", "long ago", now - 3700, now - 3580, id="gone")
    late = celery.send_task(celery_app.EVICT, args=["tiny-lm"], kwargs={"version": "v1", **old.task_kwargs()},
                            queue=g.queue)
    assert "evict of tiny-lm@v1 on node-a/cpu:0 dropped as stale: its intent expired" in _failure(celery, late.id)
    assert rep(r, gid, "tiny-lm").state == "ready" and not events.read(r, kind="evicted")
    # Tasks sent without an intent (by hand) are never stale.
    out = celery.send_task(celery_app.PRELOAD, args=["tiny-mlp", "v1"], queue=g.queue).get(timeout=60)
    assert out["state"] == "ready" and w.alive()


def test_a_preload_queued_behind_loads_outlives_its_intent_ttl(r: redis.Redis, celery: Celery, catalog: Path,
                                                              worker_factory) -> None:
    # One load at a time, and the first takes at least 15 s (paced): the second waits in the queue (`pending`)
    # for far longer than its 4 s intent TTL (which still leaves room for a slow delivery on a busy machine).
    # The worker holding it keeps its intent alive, so it is not stale.
    pace = size_of(catalog, "tiny-sharded") / 15
    w = worker_factory(catalog, devices="cpu:0=64MiB",
                       env={"PREWARM_MAX_LOADS_PER_GPU": "1", "PREWARM_LOAD_PACE_BYTES_PER_S": str(int(pace))})
    g = gpu(r, "node-a/cpu:0")
    d = Dispatcher(r, celery, intent_ttl=4.0)
    blocker = d.preload("tiny-sharded", "v1", g, actor="scheduler", reason="first")
    queued = d.preload("tiny-lm", "v1", g, actor="scheduler", reason="second")
    wait_for(lambda: (x := rep(r, g.id, "tiny-lm")) and x.state == "pending", 20, what="tiny-lm queued", log=w.log)
    assert celery.AsyncResult(blocker.task_id).get(timeout=60)["state"] == "ready"
    assert celery.AsyncResult(queued.task_id).get(timeout=60)["state"] == "ready"
    assert not events.read(r, kind="stale")
    assert not r.exists(keys.intent("tiny-lm", g.id)), "released once ready"
