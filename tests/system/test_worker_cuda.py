"""The worker on a real CUDA device (skipped where there is none): the same cycle, with the driver's figures."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import torch

from gpu_worker.errors import DoesNotFit
from gpu_worker.residency import NodeWorker, WorkerOptions
from prewarm import state
from prewarm.config import parse_devices
from tests.model_files import tiny_catalog

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_cuda_preload_infer_evict(r: redis.Redis, tmp_path: Path) -> None:
    cat = tiny_catalog(tmp_path / "m", ["tiny-sharded", "tiny-lm-bf16", "tiny-mlp"])
    w = NodeWorker(r, cat, "node-g", parse_devices("cuda:0=1GiB"), WorkerOptions(heartbeat_ttl=30))
    g = w.gpu_for("cuda:0")
    assert g.device.kind == "cuda" and g.device.inventory().total_bytes == 1024**3
    base = torch.cuda.memory_allocated(0)
    out = w.preload(g, "tiny-sharded")
    assert out["state"] == "ready"
    assert torch.cuda.memory_allocated(0) - base >= out["bytes"]  # the weights are on the device
    res = w.infer(g, "tiny-sharded")
    assert res["output"]["finite"] and res["output"]["shape"] == [1, 16, 1024]
    assert w.preload(g, "tiny-lm-bf16")["state"] == "ready"
    w.heartbeat()
    pub = state.read_fleet(r).gpu(g.id)
    assert pub.kind == "cuda" and pub.used_bytes == sum(x.bytes for x in pub.replicas)
    assert {x.model for x in pub.replicas} == {"tiny-sharded", "tiny-lm-bf16"}
    freed = w.evict(g, "tiny-sharded")["bytes_freed"] + w.evict(g, "tiny-lm-bf16")["bytes_freed"]
    assert freed > out["bytes"]
    assert torch.cuda.memory_allocated(0) == base  # every replica tensor released
    assert g.device.inventory().used_bytes == 0


def test_cuda_model_bigger_than_the_budget(r: redis.Redis, tmp_path: Path) -> None:
    cat = tiny_catalog(tmp_path / "m", ["tiny-sharded"])
    w = NodeWorker(r, cat, "node-g", parse_devices("cuda:0=1MiB"), WorkerOptions(heartbeat_ttl=30))
    g = w.gpu_for("cuda:0")
    base = torch.cuda.memory_allocated(0)
    with pytest.raises(DoesNotFit, match="can never fit"):
        w.preload(g, "tiny-sharded")
    assert torch.cuda.memory_allocated(0) == base


def test_cuda_promotes_a_pinned_staged_copy(r: redis.Redis, tmp_path: Path) -> None:
    cat = tiny_catalog(tmp_path / "m", ["tiny-sharded"])
    w = NodeWorker(r, cat, "node-g", parse_devices("cuda:0=1GiB"),
                   WorkerOptions(heartbeat_ttl=30, host_cache_bytes=64 * 2**20))
    g = w.gpu_for("cuda:0")
    base = torch.cuda.memory_allocated(0)
    assert w.preload(g, "tiny-sharded")["source"] == "storage"
    reference = w.infer(g, "tiny-sharded", [[1, 2, 3, 4]])["output"]
    w.evict(g, "tiny-sharded")
    staged = w.stage("tiny-sharded")
    assert staged["pinned"], "a CUDA worker page-locks its host cache"
    assert torch.cuda.memory_allocated(0) == base  # staging uses no device memory
    out = w.preload(g, "tiny-sharded")
    assert out["source"] == "host" and torch.cuda.memory_allocated(0) - base >= out["bytes"]
    got = w.infer(g, "tiny-sharded", [[1, 2, 3, 4]])["output"]
    assert got["shape"] == reference["shape"] and got["top"] == reference["top"]
    assert got["mean"] == pytest.approx(reference["mean"], rel=1e-4, abs=1e-6)
    w.evict(g, "tiny-sharded")
    assert torch.cuda.memory_allocated(0) == base
    assert w.unstage("tiny-sharded")["bytes_freed"] == staged["bytes"]


def test_cuda_graphs_are_captured_per_warmup_shape_and_replayed(r: redis.Redis, tmp_path: Path) -> None:
    """catalog cuda_graphs = true: warmup captures each declared shape, infer replays it (the same output
    as the eager module), another shape runs eagerly, and evict frees the graphs with the weights."""
    cat = tiny_catalog(tmp_path / "m", ["tiny-lm"])
    cat.write_text(cat.read_text().replace('version = "v1"', 'version = "v1"\ncuda_graphs = true', 1))
    w = NodeWorker(r, cat, "node-g", parse_devices("cuda:0=1GiB"), WorkerOptions(heartbeat_ttl=30))
    g = w.gpu_for("cuda:0")
    base = torch.cuda.memory_allocated(0)
    out = w.preload(g, "tiny-lm")
    assert out["state"] == "ready" and all(f["cuda_graph"] is True for f in out["warmup"]), out["warmup"]
    replayed = w.infer(g, "tiny-lm")
    assert replayed["cuda_graph"] is True and replayed["output"]["finite"]
    with g.lock:
        rt = next(iter(g.replicas.values())).runtime
    x = torch.randint(0, 8, tuple(replayed["input"]["shape"]), device="cuda:0")
    with torch.inference_mode():
        eager = rt.module(x)
    y, used = rt.graphs.run(x, rt.module)
    assert used and torch.allclose(y, eager, atol=1e-4)
    shape = [1, 3]  # not declared: eager
    other = w.infer(g, "tiny-lm", {"shape": shape, "dtype": "int64", "high": 8})
    assert other["cuda_graph"] is False and other["input"]["shape"] == shape
    w.evict(g, "tiny-lm")
    del rt, y, eager
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(0) == base
