"""The drain's records and round against a real Redis, with the fleet announced as workers would
(prewarm.store.drains, prewarm.services.drain): idempotent, refused for an unknown node, and the round sends
one replacement per replica that needs a home, on a GPU of another node, and no second one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from prewarm import events, state, traffic
from prewarm.context import Context
from prewarm.services import drain
from prewarm.store import drains, overlays
from tests.web_support import make_catalog, make_context, publish_gpu, queued_tasks, replica

A, B = "node-a/cpu:0", "node-b/cpu:0"


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> Context:
    return make_context(redis_url, make_catalog(tmp_path / "models"))


def test_begin_is_idempotent_and_refuses_an_unknown_node(r: redis.Redis, ctx: Context) -> None:
    publish_gpu(r, A)
    with pytest.raises(drain.UnknownNode, match=r"node 'node-z' is not in the fleet \(nodes with a live worker: node-a\)"):
        drain.begin(r, "node-z", actor="operator", reason="test", grace_s=300)
    first = drain.begin(r, "node-a", actor="operator", reason="maintenance", grace_s=300)
    again = drain.begin(r, "node-a", actor="worker", reason="SIGTERM", grace_s=300)
    assert first.new and not again.new and again.drain == first.drain and "draining already" in again.message
    assert [(e.actor, e.reason, e.gpu) for e in events.read(r, kind="drain")] == [("operator", "maintenance", "node-a")]
    fleet = state.read_fleet(r)
    assert fleet.gpu(A).draining and fleet.placeable() == []  # type: ignore[union-attr]


def test_finish_end_and_a_new_worker(r: redis.Redis, ctx: Context) -> None:
    publish_gpu(r, A)
    drain.begin(r, "node-a", actor="operator", reason="t", grace_s=300)
    assert drains.finish(r, "node-a", worker="fake-worker", evicted=2, now=time.time())
    assert drains.get(r, "node-a").state == drains.DRAINED  # type: ignore[union-attr]
    assert not drains.finish(r, "node-a", worker="fake-worker", evicted=2, now=time.time())  # once
    # drained, its worker still on its way out: a drain again changes nothing
    again = drain.begin(r, "node-a", actor="operator", reason="t", grace_s=300)
    assert not again.new and "drained already" in again.message and len(events.read(r, kind="drain")) == 1
    assert drains.clear_for_new_worker(r, "node-a", "fake-worker", time.time()) is None  # the same worker
    assert drains.clear_for_new_worker(r, "node-a", "node-a:42:new", time.time()) is not None
    assert drains.get(r, "node-a") is None and [e.actor for e in events.read(r, kind="undrain")] == ["worker"]
    assert drain.end(r, "node-a", actor="operator", reason="t") is None  # not draining: nothing to undo
    with pytest.raises(drain.UnknownNode):
        drain.end(r, "node-z", actor="operator", reason="t")


def test_the_round_moves_what_has_demand_once_and_never_onto_a_draining_node(r: redis.Redis, ctx: Context) -> None:
    # alpha pinned, beta requested a minute ago, gamma idle: all ready on node-a; node-b and node-c empty
    publish_gpu(r, A, replicas=[replica(m, A) for m in ("alpha", "beta", "gamma")])
    publish_gpu(r, B)
    publish_gpu(r, "node-c/cpu:0", total_mib=16)  # the tightest fit: the placement rule's first, were it placeable
    overlays.set_pinned(r, "alpha", True)
    traffic.record(r, [("beta", 1, time.time() - 60)])
    drain.begin(r, "node-a", actor="operator", reason="t", grace_s=300)
    drain.begin(r, "node-c", actor="operator", reason="t", grace_s=300)
    fleet = state.read_fleet(r)
    needs = {n.model: n for n in drain.needs(r, ctx.catalog, fleet, time.time())}
    assert sorted(needs) == ["alpha", "beta"] and needs["alpha"].why == "pinned" and needs["beta"].to_load == 1

    sent = drain.drain_round(ctx, fleet)
    assert sorted((x.model, x.gpu) for x in sent) == [("alpha", B), ("beta", B)]  # node-c drains too
    assert sorted(t["headers"]["task"] for t in queued_tasks(r, state.queue_name("node-b", "cpu:0"))) == \
        ["prewarm.preload", "prewarm.preload"]
    preloads = events.read(r, kind="preload")
    assert {e.numbers["kind"] for e in preloads} == {"drain"} and all(e.actor == "scheduler" for e in preloads)
    # the next round sees the preloads in flight (their intents): nothing sent twice
    assert drain.drain_round(ctx, state.read_fleet(r)) == []
    left = drain.needs(r, ctx.catalog, state.read_fleet(r), time.time(), {"node-a"})
    assert [(n.model, n.homeless, n.to_load) for n in left] == [("alpha", 1, 0), ("beta", 1, 0)]
    # once ready on node-b, nothing on node-a needs a home: its worker may evict
    publish_gpu(r, B, replicas=[replica("alpha", B), replica("beta", B)])
    assert drain.needs(r, ctx.catalog, state.read_fleet(r), time.time(), {"node-a"}) == []


def test_the_console_and_the_fleet_api_show_a_draining_node(r: redis.Redis, redis_url: str, tmp_path: Path) -> None:
    from tests.system.test_api import ADMIN, _login
    from web.app import create_app

    app = create_app(make_context(redis_url, make_catalog(tmp_path / "models"), admin_token=ADMIN))
    client = app.test_client()
    _login(client)
    publish_gpu(r, A, replicas=[replica("alpha", A)])
    publish_gpu(r, B)
    assert 'data-drain="draining"' not in client.get("/fleet").get_data(as_text=True)
    drain.begin(r, "node-a", actor="operator", reason="kernel upgrade", grace_s=300)
    html = client.get("/fleet").get_data(as_text=True)
    section = html[html.index('data-node="node-a"'):html.index('data-node="node-b"')]
    assert 'data-drain="draining"' in section and "draining · no new loads" in section and "kernel upgrade" in section
    assert 'data-drain="draining"' not in html[html.index('data-node="node-b"'):]
    # the route hook's on-demand placement passes node-a over, though it is the tightest fit (alpha is there)
    cold = client.get("/hooks/route", query_string={"model": "gamma"}).get_json()
    assert cold["state"] == "cold" and cold["preload"]["queued"] and cold["preload"]["gpu"] == B, cold
    view = client.get("/api/fleet").get_json()
    assert [g["draining"] for g in view["gpus"]] == [True, False]
    assert [n["drain"] and n["drain"]["state"] for n in view["by_node"]] == ["draining", None]
