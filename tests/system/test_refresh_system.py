"""Replica refresh by age (issue 14, item 6) with real processes: Redis, a worker, web (gunicorn) and the
scheduler. A model kept at one replica (min_replicas) with max_replica_age = 3s is replaced again and
again, make-before-break: every route lookup meanwhile finds it ready. With one GPU there is no room for
the replacement: the old replica stays, and the decision log says so once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
import requests

from prewarm import events, state
from tests.model_files import tiny_catalog
from tests.procs import wait_for, worker_factory  # noqa: F401  (fixture)
from tests.scheduler_procs import SchedulerProc
from tests.web_support import WebProc

pytestmark = pytest.mark.slow


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    cat = tiny_catalog(tmp_path / "models", ["tiny-mlp", "tiny-lm"])
    text = cat.read_text()
    head = 'id = "tiny-mlp"\nversion = "v1"'
    assert head in text
    cat.write_text(text.replace(head, f'{head}\nmin_replicas = 1\nmax_replica_age = "3s"', 1))
    return cat


def ready_replicas(r: redis.Redis, model: str) -> list[state.Replica]:
    return [x for x in state.read_fleet(r).replicas(model) if x.state == "ready"]


def test_an_old_replica_is_replaced_and_the_model_stays_ready(redis_url, r, catalog, web: WebProc, schedulers,
                                                              tmp_path, worker_factory) -> None:  # noqa: F811
    w = worker_factory(catalog, devices="cpu:0=256MiB,cpu:1=256MiB")
    schedulers.append(SchedulerProc(redis_url, catalog, tmp_path))
    wait_for(lambda: ready_replicas(r, "tiny-mlp"), 60, what="tiny-mlp ready (min_replicas)", log=w.log)
    states: list[str] = []
    seen_gpus: set[str] = set()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        # retry=1: a poll, not a request (the hit rate stays out of it); the answer lists every replica
        body = requests.get(f"{web.url}/hooks/route", params={"model": "tiny-mlp", "retry": "1"}, timeout=10).json()
        states.append(body["state"])
        seen_gpus |= {x["gpu"] for x in body["replicas"] if x["state"] == "ready"}
        refreshed = [e for e in events.read(r, model="tiny-mlp", kind="evict") if e.numbers.get("kind") == "refresh"]
        if len(refreshed) >= 2:
            break
        time.sleep(0.1)
    assert len(refreshed) >= 2, (states[-5:], schedulers[0].log()[-3000:])
    assert set(states) == {"ready"}, f"the model was not ready at some lookup: {sorted(set(states))}"
    assert seen_gpus == set(w.gpu_ids)  # replaced on the other GPU, then back
    assert all("max_replica_age" in e.reason for e in refreshed)
    loads = [e for e in events.read(r, model="tiny-mlp", kind="preload") if e.numbers.get("kind") == "refresh"]
    assert len(loads) >= 2 and all(e.actor == "scheduler" for e in loads)
    # each refresh evict came after its replacement was ready (make-before-break)
    ready_at = sorted(e.ts for e in events.read(r, model="tiny-mlp", kind="ready"))
    for e in refreshed:
        assert sum(t < e.ts for t in ready_at) >= 2, "evicted before a replacement was ready"


def test_with_no_room_for_a_replacement_the_old_replica_stays_and_the_log_says_why(
        redis_url, r, catalog, schedulers, tmp_path, worker_factory) -> None:  # noqa: F811
    w = worker_factory(catalog, devices="cpu:0=256MiB")  # one GPU: two replicas of a model never share one
    schedulers.append(SchedulerProc(redis_url, catalog, tmp_path))
    first = wait_for(lambda: ready_replicas(r, "tiny-mlp"), 60, what="tiny-mlp ready", log=w.log)[0]
    keep = wait_for(lambda: [e for e in events.read(r, model="tiny-mlp", kind="keep")], 30,
                    what="a keep event", log=schedulers[0].log)
    assert keep[0].numbers["kind"] == "refresh_blocked" and "no other GPU" in keep[0].reason, keep[0]
    time.sleep(3.0)  # a few more ticks: the same decision, not logged again
    assert len(events.read(r, model="tiny-mlp", kind="keep")) == 1
    now = ready_replicas(r, "tiny-mlp")
    assert [x.created_at for x in now] == [first.created_at]  # the same replica, still ready
    assert not [e for e in events.read(r, model="tiny-mlp", kind="evict")]
