"""gpu_worker.host_cache: the loader's staging ring and the node's host-memory cache."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import gpu_worker.loader as loader
from gpu_worker.host_cache import (
    HostCache,
    HostCacheFull,
    copy_tensors,
    default_host_cache_bytes,
)
from gpu_worker.read_ring import ReadRing

CPU = torch.device("cpu")


def make_model(tmp_path: Path, name: str, nbytes: int, seed: int = 0) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    n = nbytes // 4
    tensors = {"w": torch.randn(n - 8, generator=g), "b": torch.randn(8, generator=g)}
    path = tmp_path / f"{name}.safetensors"
    save_file(tensors, path)
    return path, tensors


def padded(n: int) -> int:
    return -(-n // 64) * 64


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------
# ReadRing (the CPU run of the logic the CUDA path uses)


def test_ring_copies_segments_and_cycles_buffers():
    ring = ReadRing(64, 2, CPU)
    assert ring.nbytes == 128
    dest = torch.zeros(100, dtype=torch.uint8)
    seen = []
    for k in range(4):
        i = ring.acquire()
        seen.append(i)
        ring.views[i][:10] = bytes(range(k * 10, k * 10 + 10))
        # first 4 bytes to one place, the next 6 to another
        ring.submit(i, [(dest, k * 20, 0, 4), (dest, k * 20 + 10, 4, 6)])
    ring.close()
    assert seen == [0, 1, 0, 1]
    for k in range(4):
        assert dest[k * 20 : k * 20 + 4].tolist() == list(range(k * 10, k * 10 + 4))
        assert dest[k * 20 + 10 : k * 20 + 16].tolist() == list(range(k * 10 + 4, k * 10 + 10))
        assert dest[k * 20 + 4 : k * 20 + 10].tolist() == [0] * 6
    assert ring.buffers == []


def test_ring_rejects_bad_sizes():
    with pytest.raises(ValueError):
        ReadRing(0, 2, CPU)


# ---------------------------------------------------------------------------------------------
# HostCache


def test_stage_promote_evict(tmp_path):
    path, tensors = make_model(tmp_path, "a", 1 << 16)
    cache = HostCache(1 << 20, pin=False)
    assert cache.budget_bytes == 1 << 20 and cache.used_bytes == 0
    progress: list[tuple[int, int]] = []
    entry = cache.stage("a@1", path, value=3.0, progress=lambda d, t: progress.append((d, t)))
    assert progress[-1] == (1 << 16, 1 << 16)
    # the arena's bytes: the data plus each tensor's padding to 64 bytes
    assert entry.nbytes == padded((1 << 16) - 32) + padded(32) == entry.arena.nbytes
    assert cache.used_bytes == entry.nbytes and cache.free_bytes == (1 << 20) - entry.nbytes
    assert "a@1" in cache and len(cache) == 1 and cache.get("a@1") is entry
    assert same(entry.tensors, tensors)
    assert entry.pinned is False

    # staging again is a no-op (same entry, no reload) that keeps the higher value
    again = cache.stage("a@1", path, value=5.0)
    assert again is entry and entry.value == 5.0

    promoted = cache.promote("a@1", CPU)
    assert same(promoted, tensors)
    for name, t in promoted.items():  # owned copies, not the cache's tensors
        assert t.data_ptr() != entry.tensors[name].data_ptr()
    promoted["w"].zero_()
    assert same(cache.get("a@1").tensors, tensors)
    assert entry.promotions == 1 and entry.last_promoted_at is not None

    assert cache.evict("a@1") == entry.nbytes
    assert entry.arena is None  # released
    assert cache.used_bytes == 0 and "a@1" not in cache
    assert cache.evict("a@1") == 0  # idempotent
    with pytest.raises(KeyError, match="not staged"):
        cache.promote("a@1", CPU)


def test_stage_sharded_index(tmp_path):
    import json

    g = torch.Generator().manual_seed(3)
    wm = {}
    tensors = {}
    for s in range(2):
        part = {f"x{s}": torch.randn(10, generator=g)}
        save_file(part, tmp_path / f"s{s}.safetensors")
        tensors.update(part)
        wm.update({k: f"s{s}.safetensors" for k in part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    cache = HostCache(1 << 20, pin=False)
    entry = cache.stage("m", tmp_path / "model.safetensors.index.json")
    assert same(entry.tensors, tensors) and entry.nbytes == 128  # 2 x 40 bytes, each padded to 64


def test_eviction_by_value_per_byte(tmp_path):
    small, _ = make_model(tmp_path, "small", 40_000, 1)
    big, _ = make_model(tmp_path, "big", 40_000, 2)
    new, new_tensors = make_model(tmp_path, "new", 40_000, 3)
    cache = HostCache(100_000, pin=False)
    cache.stage("cheap", small, value=1.0)
    cache.stage("dear", big, value=10.0)
    # room for only one more: the cheaper per byte goes, if the newcomer is worth more per byte
    assert cache.plan_eviction(40_000, 5.0) == ["cheap"]
    cache.stage("new", new, value=5.0)
    assert set(k for k in ("cheap", "dear", "new") if k in cache) == {"dear", "new"}
    assert cache.used_bytes == 2 * (padded(40_000 - 32) + padded(32))
    assert same(cache.get("new").tensors, new_tensors)

    # a newcomer worth less per byte than everything staged is refused and evicts nothing
    low, _ = make_model(tmp_path, "low", 40_000, 4)
    with pytest.raises(HostCacheFull, match="worth more"):
        cache.stage("low", low, value=0.5)
    assert set(e.key for e in cache.entries()) == {"dear", "new"}
    assert cache.used_bytes == 2 * (padded(40_000 - 32) + padded(32))

    # bigger than the whole budget
    huge, _ = make_model(tmp_path, "huge", 200_000, 5)
    with pytest.raises(HostCacheFull, match="budget"):
        cache.stage("huge", huge, value=1e9)


def test_value_hook_and_set_value(tmp_path):
    a, _ = make_model(tmp_path, "a", 40_000, 1)
    b, _ = make_model(tmp_path, "b", 40_000, 2)
    c, _ = make_model(tmp_path, "c", 40_000, 3)
    scores = {"a": 1.0, "b": 2.0}
    cache = HostCache(100_000, pin=False, value_fn=lambda e: scores.get(e.key, 0.0))
    cache.stage("a", a)
    cache.stage("b", b)
    scores["a"] = 100.0  # the hook, not the staged value, decides
    assert cache.plan_eviction(40_000, 50.0) == ["b"]
    plain = HostCache(100_000, pin=False)
    plain.stage("a", a, value=1.0)
    plain.stage("b", b, value=2.0)
    plain.set_value("a", 3.0)
    assert plain.plan_eviction(40_000, 100.0) == ["b"]
    plain.stage("c", c, value=100.0)
    assert "b" not in plain and "a" in plain


def test_entry_being_promoted_is_not_evicted(tmp_path):
    a, tensors = make_model(tmp_path, "a", 40_000, 1)
    b, _ = make_model(tmp_path, "b", 40_000, 2)
    cache = HostCache(60_000, pin=False)
    cache.stage("a", a, value=1.0)
    cache.get("a")._users = 1  # as during a running promotion
    with pytest.raises(HostCacheFull):
        cache.stage("b", b, value=100.0)
    assert "a" in cache
    cache.get("a")._users = 0
    cache.stage("b", b, value=100.0)
    assert "a" not in cache


def test_evict_during_promotion_keeps_the_promotion_whole(tmp_path, monkeypatch):
    a, tensors = make_model(tmp_path, "a", 1 << 20, 1)
    cache = HostCache(4 << 20, pin=False)
    cache.stage("a", a)
    started, release = threading.Event(), threading.Event()
    import gpu_worker.host_cache as staging

    real = staging.copy_tensors

    def slow_copy(t, device, progress=None):
        started.set()
        release.wait(5)
        return real(t, device, progress=progress)

    monkeypatch.setattr(staging, "copy_tensors", slow_copy)
    out: dict = {}
    th = threading.Thread(target=lambda: out.update(cache.promote("a", CPU)))
    th.start()
    assert started.wait(5)
    arena = cache.get("a").arena
    assert cache.evict("a") == arena.nbytes
    assert cache.used_bytes == 0
    assert arena.buffer is not None  # still in use by the promotion: released when it ends
    release.set()
    th.join(5)
    assert same(out, tensors)
    assert arena.buffer is None


def test_concurrent_stage_of_one_key_loads_once(tmp_path, monkeypatch):
    a, tensors = make_model(tmp_path, "a", 1 << 16, 1)
    calls = []
    real = loader.load_weights

    def counting(*args, **kw):
        calls.append(1)
        time.sleep(0.05)
        return real(*args, **kw)

    monkeypatch.setattr(loader, "load_weights", counting)
    cache = HostCache(1 << 20, pin=False)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.stage("a", a))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(calls) == 1
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert cache.used_bytes == results[0].nbytes


def test_failed_stage_releases_its_reservation(tmp_path):
    a, _ = make_model(tmp_path, "a", 1 << 16, 1)
    a.write_bytes(a.read_bytes()[:-10])  # truncated: rejected by the header check
    cache = HostCache(1 << 20, pin=False)
    with pytest.raises(loader.SafetensorsError, match="truncated"):
        cache.stage("a", a)
    assert cache.used_bytes == 0 and "a" not in cache

    b, tensors = make_model(tmp_path, "b", 1 << 16, 2)
    with pytest.raises(loader.WeightMismatchError):
        cache.stage("b", b, expected={"w": (torch.float16, (1,))})
    assert cache.used_bytes == 0
    cache.stage("b", b)  # and a later stage of the same key works
    assert same(cache.get("b").tensors, tensors)


def test_stage_reads_only_inside_the_model_roots(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    a, tensors = make_model(root, "a", 1 << 16, 1)
    secret = tmp_path / "passwd"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 4)
    link = root / "b.safetensors"
    link.symlink_to(secret)
    cache = HostCache(1 << 20, pin=False)
    with pytest.raises(loader.SafetensorsError, match="outside the model roots") as info:
        cache.stage("b", link, roots=[root.resolve()])
    assert "root:x" not in str(info.value)
    assert cache.used_bytes == 0 and "b" not in cache
    assert same(cache.stage("a", a, roots=[root.resolve()]).tensors, tensors)


def test_budget_from_the_setting() -> None:
    import psutil

    from gpu_worker.held import WorkerOptions
    from prewarm.config import Settings

    total = psutil.virtual_memory().total
    assert default_host_cache_bytes(None) == total // 4
    assert default_host_cache_bytes("3GiB") == 3 << 30
    assert default_host_cache_bytes("10%") == int(total * 0.1)
    with pytest.raises(ValueError, match="PREWARM_HOST_CACHE"):
        default_host_cache_bytes("lots")
    # the worker's options take it from Settings (PREWARM_HOST_CACHE), the one reader of the environment
    assert WorkerOptions.from_settings(Settings.from_env({"PREWARM_HOST_CACHE": "3GiB"})).host_cache_bytes == 3 << 30
    assert WorkerOptions.from_settings(Settings.from_env({})).host_cache_bytes is None
    assert HostCache().budget_bytes == total // 4


def test_copy_tensors_reports_progress_and_owns():
    src = {"a": torch.arange(10.0), "b": torch.ones(3, dtype=torch.int64)}
    seen = []
    out = copy_tensors(src, CPU, progress=lambda d, t: seen.append((d, t)))
    assert same(out, src)
    assert out["a"].data_ptr() != src["a"].data_ptr()
    assert seen[-1] == (64, 64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_stage_and_promote_to_cuda(tmp_path):
    a, tensors = make_model(tmp_path, "a", 1 << 20, 1)
    cache = HostCache(4 << 20)
    entry = cache.stage("a", a)
    assert entry.pinned and all(t.is_pinned() for t in entry.tensors.values())
    out = cache.promote("a", "cuda:0")
    assert same({k: v.cpu() for k, v in out.items()}, tensors)


def test_arena_views_are_aligned_and_share_one_buffer():
    from gpu_worker.host_cache import HostArena

    sizes = {"a": 12, "b": 0, "c": 4 * 5, "d": 8}
    arena = HostArena(sizes, pin=False)
    assert arena.nbytes == 64 + 0 + 64 + 64 and not arena.pinned
    a = arena.allocate("a", (3,), torch.float32)
    b = arena.allocate("b", (0, 2), torch.float16)
    c = arena.allocate("c", (5,), torch.int32)
    d = arena.allocate("d", (), torch.float64)
    base = arena.buffer.data_ptr()
    for t in (a, c, d):
        assert (t.data_ptr() - base) % 64 == 0 and t.is_contiguous()
        assert t.untyped_storage().data_ptr() == base
    assert b.shape == (0, 2) and d.shape == ()
    a.fill_(1.5)
    c.fill_(-7)
    d.fill_(2.25)
    assert a.tolist() == [1.5] * 3 and c.tolist() == [-7] * 5 and d.item() == 2.25
    arena.release()
    with pytest.raises(RuntimeError, match="released"):
        arena.allocate("a", (3,), torch.float32)
    assert a.tolist() == [1.5] * 3  # views already handed out stay valid memory


def test_pinned_arena_registers_once_and_unregisters_on_evict_failure_and_gc(tmp_path, monkeypatch):
    """The CUDA pinning calls, recorded on a machine without CUDA."""
    import gc

    import gpu_worker.host_cache as staging

    calls: list[tuple] = []
    monkeypatch.setattr(staging, "_host_register", lambda ptr, n: calls.append(("reg", ptr, n)) or True)
    monkeypatch.setattr(staging, "_host_unregister", lambda ptr: calls.append(("unreg", ptr)))
    a, tensors = make_model(tmp_path, "a", 1 << 16, 1)
    cache = HostCache(1 << 20, pin=True)
    entry = cache.stage("a", a)
    assert entry.pinned
    assert calls == [("reg", entry.arena.buffer.data_ptr(), entry.nbytes)]
    assert same(entry.tensors, tensors)
    ptr = calls[0][1]
    cache.evict("a")
    assert calls[-1] == ("unreg", ptr) and len(calls) == 2

    # a stage that fails after its arena was pinned unpins it
    calls.clear()
    with pytest.raises(loader.WeightMismatchError):
        cache.stage("a", a, expected={"w": (torch.float16, (1,))})
    assert [c[0] for c in calls] == ["reg", "unreg"]

    # an arena dropped without release() is unpinned when its buffer is collected
    calls.clear()
    arena = staging.HostArena({"x": 128}, pin=True)
    del arena
    gc.collect()
    assert [c[0] for c in calls] == ["reg", "unreg"]


def test_arena_stays_unpinned_when_registration_fails(monkeypatch):
    import gpu_worker.host_cache as staging

    monkeypatch.setattr(staging, "_host_register", lambda ptr, n: False)
    arena = staging.HostArena({"x": 128}, pin=True)
    assert not arena.pinned and arena.buffer is not None


def test_copy_tensors_cancelled_by_progress_stops_its_threads_first(monkeypatch):
    import ctypes as ct

    import gpu_worker.host_cache as staging

    real = ct.memmove
    active = {"n": 0, "calls": 0}
    cancelled = threading.Event()

    def slow_memmove(d, s, n):
        active["n"] += 1
        active["calls"] += 1
        time.sleep(0.02)
        r = real(d, s, n)
        active["n"] -= 1
        return r

    monkeypatch.setattr(staging.ctypes, "memmove", slow_memmove)
    src = {"a": torch.arange(48 << 20, dtype=torch.uint8), "b": torch.ones(48 << 20, dtype=torch.uint8)}

    def cancel(done, total):
        cancelled.set()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        copy_tensors(src, CPU, progress=cancel, threads=2)
    assert cancelled.is_set()
    assert active["n"] == 0  # every copy thread had finished before the exception left
    assert active["calls"] < 12  # and they stopped early: 12 pieces of 8 MiB were planned
    out = copy_tensors(src, CPU, threads=3)
    assert same(out, src)
