"""The route lookup as a service (prewarm.services.routing), called without Flask as a router integration
would: ready / loading / cold, one on-demand preload and one scheduler wake-up per cold episode, the ETA and the
fallback, and what is counted for a request against a retry poll. A real Redis; the fleet is published as the
worker's heartbeats would publish it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import redis

from prewarm import celery_app, keys
from prewarm.context import Context
from prewarm.services import routing
from prewarm.store import cold_starts
from tests.web_support import make_catalog, make_context, publish_gpu, queued_tasks, replica

GPU_A, GPU_B = "node-a/cpu:0", "node-b/cpu:0"


class Counted:
    def __init__(self) -> None:
        self.lookups: list[str] = []
        self.cold_starts: list[str] = []
        self.fallbacks: list[tuple[str, str]] = []

    def lookup(self, answer: str) -> None:
        self.lookups.append(answer)

    def cold_start(self, model: str) -> None:
        self.cold_starts.append(model)

    def fallback_offer(self, model: str, fallback: str) -> None:
        self.fallbacks.append((model, fallback))


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> Context:
    path = make_catalog(tmp_path / "models")
    path.write_text(path.read_text().replace('id = "beta"\n', 'id = "beta"\nfallback = "alpha"\n'))
    return make_context(redis_url, path)


def test_ready_replicas_come_least_busy_first_and_close_the_episode(ctx: Context, r: redis.Redis) -> None:
    busy, idle = replica("alpha", GPU_A), replica("alpha", GPU_B)
    busy.in_flight, idle.in_flight = 3, 0
    publish_gpu(r, GPU_A, replicas=[busy])
    publish_gpu(r, GPU_B, replicas=[idle])
    cold_starts.open_episode(r, "alpha", "v1")
    counted = Counted()
    answer = routing.lookup(ctx, ctx.catalog.get("alpha"), priority="normal", counted=True, counters=counted)
    assert answer.body["state"] == "ready" and answer.headers == {}
    assert [x["gpu"] for x in answer.body["replicas"]] == [GPU_B, GPU_A]
    assert cold_starts.open_episode(r, "alpha", "v1")  # it was closed: a new one opens
    assert counted.lookups == ["ready"] and counted.cold_starts == []


def test_a_cold_model_gets_one_preload_and_one_wake_up_per_episode(ctx: Context, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, total_mib=64)
    wake = r.pubsub(ignore_subscribe_messages=True)
    wake.subscribe(keys.WAKE)
    wake.get_message(timeout=1)
    counted = Counted()
    entry = ctx.catalog.get("gamma")
    first = routing.lookup(ctx, entry, priority="high", counted=True, counters=counted)
    assert first.body["state"] == "cold" and first.body["preload"]["queued"] is True
    assert first.body["preload"]["gpu"] == GPU_A and "Retry-After" in first.headers
    assert first.body["eta_seconds"] > 0
    tasks = queued_tasks(r, "gpu.node-a.cpu:0")
    assert [t["headers"]["task"] for t in tasks] == [celery_app.PRELOAD]
    message = wake.get_message(timeout=5)
    assert message is not None and message["data"] == entry.key.encode()

    # The router's poll while it waits: the preload is in flight (its intent), not counted as a request.
    again = routing.lookup(ctx, entry, priority="high", counted=False, counters=counted)
    assert again.body["state"] == "loading" and "preload" not in again.body
    assert len(queued_tasks(r, "gpu.node-a.cpu:0")) == 1 and wake.get_message(timeout=0.5) is None
    assert counted.lookups == ["cold"] and counted.cold_starts == ["gamma"]
    wake.close()


def test_a_cold_answer_offers_the_fallback_and_counts_it_for_requests_only(ctx: Context, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, total_mib=2, replicas=[replica("alpha", GPU_A)])  # no room for beta
    counted = Counted()
    entry = ctx.catalog.get("beta")
    answer = routing.lookup(ctx, entry, priority="normal", counted=True, counters=counted)
    assert answer.body["state"] == "cold" and answer.body["preload"]["queued"] is False
    assert "the scheduler will make room" in answer.body["preload"]["message"]
    fb = answer.body["fallback"]
    assert (fb["model"], [x["gpu"] for x in fb["replicas"]]) == ("alpha", [GPU_A])
    routing.lookup(ctx, entry, priority="normal", counted=False, counters=counted)  # a retry poll
    assert counted.fallbacks == [("beta", "alpha")] and counted.lookups == ["cold"]
    assert r.get(keys.cold_claim(entry.key)) is None  # nothing was sent: the next lookup may try again


def test_the_on_demand_load_takes_only_an_idle_link_and_leaves_a_busy_one_to_the_scheduler(
        ctx: Context, r: redis.Redis) -> None:
    """PREWARM_LINK_WAIT=1: a GPU with room whose link carries a load is not the lookup's to share; the scheduler,
    woken at once, chooses between sharing that link and waiting for it (placement.place). With it off
    (PREWARM_LINK_WAIT=0), the lookup queues the load there."""
    publish_gpu(r, GPU_A, total_mib=64, replicas=[replica("alpha", GPU_A, "loading", progress=0.2)])
    wake = r.pubsub(ignore_subscribe_messages=True)
    wake.subscribe(keys.WAKE)
    wake.get_message(timeout=1)
    entry = ctx.catalog.get("gamma")
    ctx.settings = replace(ctx.settings, link_wait=True)
    answer = routing.lookup(ctx, entry, priority="normal", counted=True, counters=Counted())
    assert answer.body["state"] == "cold" and answer.body["preload"]["queued"] is False
    assert "an idle link" in answer.body["preload"]["message"]
    assert queued_tasks(r, "gpu.node-a.cpu:0") == []
    message = wake.get_message(timeout=5)
    assert message is not None and message["data"] == entry.key.encode()
    wake.close()
    assert r.get(keys.cold_claim(entry.key)) is None  # nothing was sent: the next lookup may try again

    ctx.settings = replace(ctx.settings, link_wait=False)
    again = routing.lookup(ctx, entry, priority="normal", counted=False, counters=Counted())
    assert again.body["preload"]["queued"] is True and again.body["preload"]["gpu"] == GPU_A
    assert [t["headers"]["task"] for t in queued_tasks(r, "gpu.node-a.cpu:0")] == [celery_app.PRELOAD]
