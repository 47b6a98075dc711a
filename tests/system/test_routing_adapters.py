"""The route lookup for LoRA adapters (issue 29, item 3), called as a router integration would, on a real
Redis with the fleet published as workers' heartbeats would publish it: an adapter is served by the base
replicas holding it; absent from a ready base it is `loading` with one adapter load (never an engine start);
with no base replica its ETA is the base's start plus its own load, and the base is what gets started."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import redis
from safetensors.numpy import save_file

from gpu_worker.demo_hf import tiny_llama_config
from gpu_worker.demo_lora import write_lora_adapter
from prewarm import celery_app, eta
from prewarm.context import Context
from prewarm.services import routing
from tests.web_support import make_context, publish_gpu, queued_tasks, replica

GPU_A, GPU_B = "node-a/cpu:0", "node-b/cpu:0"
ENDPOINT = "http://127.0.0.1:8011/v1"


@pytest.fixture
def ctx(redis_url: str, tmp_path: Path) -> Context:
    root = tmp_path / "models"
    (root / "base").mkdir(parents=True)
    (root / "base" / "config.json").write_text(json.dumps(tiny_llama_config()))
    save_file({"w": np.zeros((1024,), np.float32)}, str(root / "base" / "model.safetensors"))
    for name in ("lora-a", "lora-b"):
        write_lora_adapter(root / name, tiny_llama_config(), rank=8)
    text = ('[[models]]\nid = "base-llm"\nversion = "v1"\nruntime = "vllm"\npath = "base"\nkv_cache_bytes = 1024\n'
            'engine_bytes = 0\nmax_adapters = 1\n[[models.warmup]]\nprompt_tokens = 8\n')
    for name in ("lora-a", "lora-b"):
        text += (f'[[models]]\nid = "{name}"\nversion = "v1"\nruntime = "vllm-adapter"\nbase = "base-llm"\n'
                 f'path = "{name}"\nrank = 8\n')
    (root / "catalog.toml").write_text(text)
    return make_context(redis_url, root / "catalog.toml")


def base_replica(gid: str, st: str = "ready"):  # noqa: ANN201
    rep = replica("base-llm", gid, st)
    rep.endpoint = ENDPOINT if st == "ready" else None
    return rep


def adapter_replica(name: str, gid: str, st: str = "ready"):  # noqa: ANN201
    rep = replica(name, gid, st)
    rep.host, rep.endpoint = "base-llm@v1", ENDPOINT if st == "ready" else None
    return rep


def lookup(ctx: Context, model: str) -> routing.Answer:
    return routing.lookup(ctx, ctx.catalog.get(model), priority="normal", counted=True)


def test_an_adapter_is_routed_to_the_base_replica_holding_it(ctx: Context, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, replicas=[base_replica(GPU_A), adapter_replica("lora-a", GPU_A)])
    publish_gpu(r, GPU_B, replicas=[base_replica(GPU_B)])
    answer = lookup(ctx, "lora-a")
    assert answer.body["state"] == "ready" and answer.body["base"] == "base-llm"
    [held] = answer.body["replicas"]
    assert held["gpu"] == GPU_A and held["endpoint"] == ENDPOINT
    assert held["model"] == "lora-a" and held["host"] == "base-llm@v1"  # the name a router sends as `model`
    assert queued_tasks(r, "gpu.node-a.cpu:0") == [] and queued_tasks(r, "gpu.node-b.cpu:0") == []


def test_absent_from_a_ready_base_it_loads_the_adapter_not_an_engine(ctx: Context, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, replicas=[base_replica(GPU_A)])
    first = lookup(ctx, "lora-a")
    assert first.body["state"] == "loading"
    assert first.body["preload"]["queued"] is True and first.body["preload"]["gpu"] == GPU_A
    assert first.body["preload"]["host"] == "base-llm@v1"
    [task] = queued_tasks(r, "gpu.node-a.cpu:0")
    assert task["headers"]["task"] == celery_app.PRELOAD and task["headers"]["argsrepr"].startswith("['lora-a'")
    # Its ETA is the adapter's own load (its measured or size-based load time), not an engine start.
    measured = eta.read_measured(r, ["lora-a", "base-llm"])
    adapter_s = eta.expected_seconds(ctx.catalog, measured, "lora-a", "v1", False)
    assert first.body["eta_seconds"] == pytest.approx(adapter_s, abs=0.05)
    assert "base_eta_seconds" not in first.body

    # One on-demand load: the router's next lookup finds it in flight.
    again = lookup(ctx, "lora-a")
    assert again.body["state"] == "loading" and "preload" not in again.body
    assert len(queued_tasks(r, "gpu.node-a.cpu:0")) == 1


def test_with_no_base_replica_the_base_starts_and_the_eta_adds_the_adapter_load(ctx: Context,
                                                                                 r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, total_mib=64)
    answer = lookup(ctx, "lora-a")
    assert answer.body["state"] == "cold"
    assert answer.body["preload"]["queued"] is True and answer.body["preload"]["gpu"] == GPU_A
    [task] = queued_tasks(r, "gpu.node-a.cpu:0")
    assert task["headers"]["argsrepr"].startswith("['base-llm'")  # the base's engine, not the adapter
    measured = eta.read_measured(r, ["lora-a"])
    adapter_s = eta.expected_seconds(ctx.catalog, measured, "lora-a", "v1", False)
    assert answer.body["base_eta_seconds"] > 0
    assert answer.body["eta_seconds"] == pytest.approx(answer.body["base_eta_seconds"] + adapter_s, abs=0.05)

    # Meanwhile the base is loading: loading, no second base start, the ETA still counts both.
    again = lookup(ctx, "lora-a")
    assert again.body["state"] == "loading" and "preload" not in again.body
    assert again.body["eta_seconds"] > adapter_s and len(queued_tasks(r, "gpu.node-a.cpu:0")) == 1


def test_a_base_with_its_slots_taken_gets_no_load_and_says_why(ctx: Context, r: redis.Redis) -> None:
    publish_gpu(r, GPU_A, replicas=[base_replica(GPU_A), adapter_replica("lora-b", GPU_A)])  # max_adapters = 1
    answer = lookup(ctx, "lora-a")
    assert answer.body["state"] == "loading" and answer.body["preload"]["queued"] is False
    assert "LoRA slot(s) taken" in answer.body["preload"]["message"]
    assert queued_tasks(r, "gpu.node-a.cpu:0") == []


def test_the_snapshot_has_adapters_with_their_host_and_their_traffic_counts_for_the_base(ctx: Context,
                                                                                         r: redis.Redis) -> None:
    from prewarm import traffic
    from prewarm.domain.policy import PolicyConfig
    from scheduler.snapshot import SnapshotReader

    publish_gpu(r, GPU_A, replicas=[base_replica(GPU_A), adapter_replica("lora-a", GPU_A)])
    now = time.time()
    traffic.record(r, [("lora-a", 2, now - 30 + i) for i in range(20)] + [("lora-b", 1, now - 20)], now=now)
    snap, _ = SnapshotReader(r, PolicyConfig()).read(ctx.catalog, now, full=True)
    assert snap.models["lora-a"].base == "base-llm" and snap.models["base-llm"].max_adapters == 1
    assert snap.models["base-llm"].base is None
    held = {(x.model, x.host) for x in snap.replicas}
    assert held == {("base-llm", None), ("lora-a", "base-llm")}
    # no request names the base: its traffic is its adapters' (41 requests)
    assert snap.traffic.total("lora-a") == 40 and snap.traffic.total("base-llm") == 41


def test_a_reloaded_catalog_is_read_anew_and_the_same_one_is_not_walked_again(ctx: Context, r: redis.Redis) -> None:
    from prewarm.catalog import load_catalog
    from prewarm.domain.policy import PolicyConfig
    from scheduler.snapshot import SnapshotReader

    publish_gpu(r, GPU_A, replicas=[base_replica(GPU_A)])
    reader = SnapshotReader(r, PolicyConfig())
    now = time.time()
    snap, _ = reader.read(ctx.catalog, now)
    view = reader._catalog
    assert snap.models["base-llm"].max_adapters == 1 and set(reader.bases) == {"lora-a", "lora-b"}
    reader.read(ctx.catalog, now + 1)
    assert reader._catalog is view  # the same catalog: its ids, bases and slots as they were
    # a reload (a new Catalog) with two slots per base replica and lora-b gone
    path = ctx.catalog.path
    text = path.read_text().replace("max_adapters = 1", "max_adapters = 2")
    path.write_text(text[:text.index('[[models]]\nid = "lora-b"')])
    snap, _ = reader.read(load_catalog(path), now + 2)
    assert snap.models["base-llm"].max_adapters == 2 and set(reader.bases) == {"lora-a"}
    assert "lora-b" not in snap.models


def test_the_scheduler_plans_an_adapter_into_its_ready_base_and_never_without_one(ctx: Context,
                                                                                 r: redis.Redis) -> None:
    from prewarm import traffic
    from scheduler.live import Scheduler

    # GPU A: the base, its one slot free; GPU B: memory, no base. lora-a is asked every second.
    publish_gpu(r, GPU_A, replicas=[base_replica(GPU_A)])
    publish_gpu(r, GPU_B, total_mib=1)
    now = time.time()
    traffic.record(r, [("lora-a", 1, now - 60 + i) for i in range(55)], now=now)
    res = Scheduler(ctx, ident="s1").tick(now)
    assert res.leader
    tasks = queued_tasks(r, "gpu.node-a.cpu:0")
    loads = [t["headers"]["argsrepr"] for t in tasks if t["headers"]["task"] == celery_app.PRELOAD]
    assert any(a.startswith("['lora-a'") for a in loads)  # an adapter load into the base's engine
    assert not any(a.startswith("['base-llm'") for a in loads)  # not an engine start
    assert not [t for t in queued_tasks(r, "gpu.node-b.cpu:0") if "lora" in t["headers"]["argsrepr"]]
