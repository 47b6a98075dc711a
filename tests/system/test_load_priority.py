"""Priority of loads (issue 14, item 3) with real processes: a worker with one load slot orders its waiting
loads high first, FIFO within a priority; the route hook's `priority` parameter reaches the task message."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import redis
from celery import Celery
from flask.testing import FlaskClient

from prewarm import events, keys
from prewarm.dispatch import Dispatcher
from tests import procs
from tests.model_files import tiny_catalog
from tests.procs import wait_for
from tests.system.test_worker_process import celery as celery  # noqa: F401 - the fixture, used by name
from tests.system.test_worker_process import gpu, rep, size_of
from tests.web_support import make_catalog, make_context, publish_gpu, queued_tasks
from web.app import create_app

worker_factory = procs.worker_factory  # the fixture, used by name


def test_a_high_priority_load_queued_last_takes_the_next_slot(r: redis.Redis, celery: Celery, tmp_path: Path,
                                                              worker_factory) -> None:
    cat = tiny_catalog(tmp_path / "m", ["tiny-sharded", "tiny-lm", "tiny-mlp", "tiny-lm-wide"])
    # One load at a time; the first is paced to about 10 s, long enough for the other three to queue
    # behind it one after the other (each seen `pending` before the next is sent, so FIFO is defined).
    pace = size_of(cat, "tiny-sharded") / 10
    w = worker_factory(cat, devices="cpu:0=64MiB",
                       env={"PREWARM_MAX_LOADS_PER_GPU": "1", "PREWARM_LOAD_PACE_BYTES_PER_S": str(int(pace))})
    g = gpu(r, "node-a/cpu:0")
    d = Dispatcher(r, celery, intent_ttl=120.0)
    sent = [d.preload("tiny-sharded", "v1", g, actor="scheduler", reason="holds the slot")]
    wait_for(lambda: (x := rep(r, g.id, "tiny-sharded")) and x.state == "loading", 30, what="the first load",
             log=w.log)
    # no priority (a message as every sender wrote it before priorities: normal), normal, then high
    for model, version, priority in (("tiny-lm", "v1", None), ("tiny-mlp", "v1", "normal"),
                                     ("tiny-lm-wide", "v1", "high")):
        sent.append(d.preload(model, version, g, actor="scheduler", reason="queued", priority=priority))
        assert sent[-1].sent, sent[-1].message
        wait_for(lambda m=model, v=version: any(x.model == m and x.version == v and x.state == "pending"
                                               for x in gpu(r, g.id).replicas), 30, what=f"{model}@{version} queued",
                 log=w.log)
    assert rep(r, g.id, "tiny-sharded").state in ("loading", "warming"), "the first load ended too soon"
    # the pending records show their priority (None: normal), which the route hook's ETA orders them by
    assert {x.model: x.priority for x in gpu(r, g.id).replicas if x.state == "pending"} == \
        {"tiny-lm": None, "tiny-mlp": None, "tiny-lm-wide": "high"}
    for x in sent:
        assert celery.AsyncResult(x.task_id).get(timeout=180)["state"] == "ready"
    ready = [(e.model, e.numbers.get("version")) for e in reversed(events.read(r, kind="ready", actor="worker"))]
    assert ready == [("tiny-sharded", "v1"), ("tiny-lm-wide", "v1"), ("tiny-lm", "v1"), ("tiny-mlp", "v1")], ready
    # the dispatcher wrote the priority only where it is not normal
    prios = {(e.model, e.numbers.get("priority")) for e in events.read(r, kind="preload")}
    assert ("tiny-lm-wide", "high") in prios and ("tiny-mlp", None) in prios and ("tiny-lm", None) in prios


def _sent(message: dict) -> tuple[str, dict]:
    """A queued preload message's model and kwargs (Celery's protocol 2 body: [args, kwargs, embed])."""
    args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    return args[0], kwargs


def test_route_priority_overrides_the_catalog_for_the_on_demand_preload(r: redis.Redis, redis_url: str,
                                                                       tmp_path: Path) -> None:
    catalog = make_catalog(tmp_path / "models")
    text = catalog.read_text().replace('id = "gamma"\nversion = "v1"', 'id = "gamma"\nversion = "v1"\npriority = "high"')
    catalog.write_text(text)
    # links shared: each lookup's on-demand preload queues on the one GPU (the test is of its priority, not the link)
    client: FlaskClient = create_app(make_context(redis_url, catalog, link_wait=False)).test_client()
    g = publish_gpu(r, "node-a/cpu:0")
    bad = client.get("/hooks/route?model=alpha&priority=urgent")
    assert bad.status_code == 400
    assert "priority 'urgent' is not one of low, normal, high" in bad.get_json()["error"], bad.get_json()
    assert queued_tasks(r, g.queue) == [] and not r.hexists(keys.COLD_STARTS, "alpha")  # refused before anything
    assert client.get("/hooks/route?model=alpha&priority=high").get_json()["preload"]["queued"] is True
    assert client.get("/hooks/route?model=beta").get_json()["preload"]["queued"] is True  # catalog: normal
    assert client.get("/hooks/route?model=gamma").get_json()["preload"]["queued"] is True  # catalog: high
    sent = dict(_sent(m) for m in queued_tasks(r, g.queue))
    assert sent["alpha"]["priority"] == "high"
    assert "priority" not in sent["beta"]  # normal is not written: every worker reads its absence as normal
    assert sent["gamma"]["priority"] == "high"
    models = {m["id"]: m for m in client.get("/api/models").get_json()["models"]}
    assert models["gamma"]["priority"] == "high" and models["alpha"]["priority"] == "normal"
