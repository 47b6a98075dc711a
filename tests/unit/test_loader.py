"""gpu_worker.loader: exact, owned, bounded loads, and clean failures on bad input."""

from __future__ import annotations

import gc
import json
import os
import pickle
import threading
import time
import weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import gpu_worker.loader as loader
from gpu_worker.loader import (
    LoadError,
    SafetensorsError,
    WeightMismatchError,
    expected_from_module,
    load_weights,
)
from prewarm.safetensors_header import INDEX_FILENAME, read_header

CPU = torch.device("cpu")


def all_dtypes() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(37, 13, generator=g)
    return {
        "f32": base,
        "f16": base.to(torch.float16),
        "bf16": base.to(torch.bfloat16),
        "f64": base.to(torch.float64)[:5],
        "i64": torch.randint(-(2**40), 2**40, (29,), generator=g),
        "i32": torch.randint(-(2**30), 2**30, (3, 7), generator=g, dtype=torch.int32),
        "i16": torch.randint(-(2**14), 2**14, (9,), generator=g, dtype=torch.int16),
        "i8": torch.randint(-100, 100, (33,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (17,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(23, generator=g) > 0.5,
        "f8": base[:4].to(torch.float8_e4m3fn),
        "scalar": torch.tensor(3.25),
        "empty": torch.zeros(0, 5),
        # bigger than every chunk size used below, and not a multiple of any of them
        "big": torch.randn(3001, 7, generator=g),
    }


@pytest.fixture
def model(tmp_path) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = all_dtypes()
    path = tmp_path / "model.safetensors"
    save_file(tensors, path)
    return path, tensors


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name, t in want.items():
        g = got[name]
        assert g.dtype == t.dtype, name
        assert g.shape == t.shape, name
        # bitwise equality (NaN-safe, works for float8)
        assert torch.equal(g.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("threads, chunk", [(1, 4096), (3, 4096), (2, 1 << 20), (None, loader.DEFAULT_CHUNK_BYTES)])
def test_exact_copy_of_every_dtype(model, staged, threads, chunk):
    path, tensors = model
    got = load_weights(path, CPU, threads=threads, chunk_bytes=chunk, staged=staged)
    assert_same(got, tensors)
    assert all(t.device == CPU for t in got.values())


def test_result_owns_its_memory(model):
    path, tensors = model
    got = load_weights(path, CPU)
    ptrs = set()
    for name, t in got.items():
        assert t._base is None, name
        assert t.is_contiguous()
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), name
        if t.numel():
            ptrs.add(t.data_ptr())
    assert len(ptrs) == sum(1 for t in got.values() if t.numel())
    # Overwriting the file afterwards must not change the tensors (no mmap, no page-cache view).
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(read_header(path).data_offset)
        f.write(b"\xa5" * (size - read_header(path).data_offset))
    assert_same(got, tensors)
    path.unlink()
    assert_same(got, tensors)


def test_many_small_tensors_beyond_one_preadv(tmp_path):
    # More tensors than IOV_MAX in one chunk: the plan must split the scatter list.
    tensors = {f"t{i:04d}": torch.full((3,), float(i)) for i in range(2500)}
    path = tmp_path / "many.safetensors"
    save_file(tensors, path)
    assert_same(load_weights(path, CPU, chunk_bytes=1 << 20), tensors)
    assert_same(load_weights(path, CPU, chunk_bytes=1 << 20, staged=True), tensors)


def test_plan_covers_each_byte_once(model):
    path, _ = model
    h = read_header(path)
    for chunk in (4096, 10_000, 1 << 20):
        plan = loader._plan([h], chunk)
        assert all(c.nbytes <= chunk and len(c.segments) <= loader._IOV_MAX for c in plan)
        spans = sorted((c.offset, c.offset + c.nbytes) for c in plan)
        assert spans[0][0] == h.data_offset and spans[-1][1] == h.file_size
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
        per_tensor: dict[str, int] = {}
        for c in plan:
            assert sum(n for _, _, n in c.segments) == c.nbytes
            for name, off, n in c.segments:
                assert off == per_tensor.get(name, 0)  # each tensor filled in order, no gap/overlap
                per_tensor[name] = off + n
        assert per_tensor == {n: e.nbytes for n, e in h.tensors.items() if e.nbytes}


def write_sharded(tmp_path: Path, shards: int = 4) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    tensors: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {f"h.{s}.w": torch.randn(64, 33, generator=g), f"h.{s}.b": torch.randn(33, generator=g).half()}
        save_file(part, tmp_path / name)
        tensors.update(part)
        weight_map.update({k: name for k in part})
    index = tmp_path / INDEX_FILENAME
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index, tensors


@pytest.mark.parametrize("staged", [False, True])
def test_sharded_set_via_index_directory_and_list(tmp_path, staged):
    index, tensors = write_sharded(tmp_path)
    assert_same(load_weights(index, CPU, chunk_bytes=4096, staged=staged), tensors)
    assert_same(load_weights(tmp_path, CPU, staged=staged), tensors)
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert_same(load_weights(shards, CPU, threads=3, staged=staged), tensors)


def test_missing_shard(tmp_path):
    index, _ = write_sharded(tmp_path)
    (tmp_path / "model-00003-of-00004.safetensors").unlink()
    with pytest.raises(SafetensorsError, match="model-00003-of-00004.safetensors"):
        load_weights(index, CPU)


def test_same_tensor_in_two_listed_files(tmp_path):
    save_file({"x": torch.ones(2)}, tmp_path / "a.safetensors")
    save_file({"x": torch.zeros(2)}, tmp_path / "b.safetensors")
    with pytest.raises(SafetensorsError, match="tensor 'x'.*ambiguous"):
        load_weights([tmp_path / "a.safetensors", tmp_path / "b.safetensors"], CPU)


def test_progress_is_monotonic_and_ends_at_total(tmp_path):
    index, tensors = write_sharded(tmp_path)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    seen: list[tuple[int, int]] = []
    load_weights(index, CPU, chunk_bytes=4096, threads=2, progress=lambda d, t: seen.append((d, t)),
                 progress_interval=0.0)
    assert seen[-1] == (total, total)
    assert all(t == total for _, t in seen)
    done = [d for d, _ in seen]
    assert done == sorted(done)
    assert seen.count((total, total)) == 1


# ---------------------------------------------------------------------------------------------
# bad input: rejected before any data read, nothing leaked


class CountingPreadv:
    def __init__(self, fail_after: int | None = None, result: int | None = None):
        self.calls = 0
        self.fail_after = fail_after
        self.result = result
        self.real = os.preadv

    def __call__(self, fd, buffers, offset):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            if self.result is not None:
                return self.result
            raise OSError(5, "Input/output error")
        return self.real(fd, buffers, offset)


def test_offsets_past_eof_rejected_before_any_tensor_read(model, monkeypatch):
    path, _ = model
    path.write_bytes(path.read_bytes()[:-100])
    spy = CountingPreadv()
    monkeypatch.setattr(os, "preadv", spy)
    allocated: list[object] = []
    monkeypatch.setattr(loader, "_allocate", lambda *a: allocated.append(a))
    with pytest.raises(SafetensorsError, match="run past the end of the file") as err:
        load_weights(path, CPU)
    assert spy.calls == 0  # no tensor byte was read
    assert allocated == []  # and nothing was allocated
    assert str(path) in str(err.value)


def test_corrupt_header_rejected(model):
    path, _ = model
    data = bytearray(path.read_bytes())
    data[8:12] = b"\xff\xff\xff\xff"
    path.write_bytes(bytes(data))
    with pytest.raises(SafetensorsError):
        load_weights(path, CPU)


def test_expected_match_and_mismatch(tmp_path, monkeypatch):
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    path = tmp_path / "m.safetensors"
    save_file({k: v.detach().clone() for k, v in module.state_dict().items()}, path)
    expected = expected_from_module(module)
    assert expected["0.weight"] == (torch.float32, (3, 4))
    got = load_weights(path, CPU, expected=expected)
    assert_same(got, module.state_dict())

    spy = CountingPreadv()
    monkeypatch.setattr(os, "preadv", spy)
    wrong_shape = {**expected, "0.weight": (torch.float32, (4, 3))}
    with pytest.raises(WeightMismatchError, match=r"tensor '0.weight'.*expected float32\[4, 3\], found float32\[3, 4\]"):
        load_weights(path, CPU, expected=wrong_shape)
    wrong_dtype = {**expected, "1.bias": (torch.float16, (2,))}
    with pytest.raises(WeightMismatchError, match=r"'1.bias'.*expected float16\[2\], found float32\[2\]"):
        load_weights(path, CPU, expected=wrong_dtype)
    missing = {**expected, "2.weight": (torch.float32, (1,))}
    with pytest.raises(WeightMismatchError, match=r"missing from the weights: '2.weight'"):
        load_weights(path, CPU, expected=missing)
    extra = {k: v for k, v in expected.items() if k != "1.bias"}
    with pytest.raises(WeightMismatchError, match=r"not in the module: '1.bias'"):
        load_weights(path, CPU, expected=extra)
    assert spy.calls == 0
    assert issubclass(WeightMismatchError, LoadError)


def track_allocations(monkeypatch) -> list[weakref.ref]:
    refs: list[weakref.ref] = []
    real = loader._allocate

    def alloc(*args):
        t = real(*args)
        refs.append(weakref.ref(t))
        return t

    monkeypatch.setattr(loader, "_allocate", alloc)
    return refs


@pytest.mark.parametrize("staged", [False, True])
def test_io_error_mid_load_frees_everything(model, monkeypatch, staged):
    path, _ = model
    refs = track_allocations(monkeypatch)
    monkeypatch.setattr(os, "preadv", CountingPreadv(fail_after=3))
    with pytest.raises(LoadError, match=r"model.safetensors: reading bytes \[\d+, \d+\) failed.*Input/output error") as err:
        load_weights(path, CPU, chunk_bytes=4096, threads=2, staged=staged)
    assert refs
    gc.collect()
    # the exception (still alive here, with its traceback) must not keep tensors alive
    assert err.value is not None
    assert [r for r in refs if r() is not None] == []


def test_file_shrinking_during_load(model, monkeypatch):
    path, _ = model
    refs = track_allocations(monkeypatch)
    monkeypatch.setattr(os, "preadv", CountingPreadv(fail_after=1, result=0))
    with pytest.raises(LoadError, match="file ended at offset"):
        load_weights(path, CPU, chunk_bytes=4096, threads=1)
    gc.collect()
    assert [r for r in refs if r() is not None] == []


def test_short_reads_are_continued(model, monkeypatch):
    path, tensors = model
    real = os.preadv

    def short(fd, buffers, offset):
        # deliver at most 1000 bytes per call, splitting buffers mid-way
        first = buffers[0]
        return real(fd, [first[: min(len(first), 1000)]], offset)

    monkeypatch.setattr(os, "preadv", short)
    assert_same(load_weights(path, CPU, chunk_bytes=1 << 16), tensors)


def test_progress_callback_can_cancel(model, monkeypatch):
    path, _ = model
    refs = track_allocations(monkeypatch)

    class Cancelled(Exception):
        pass

    def cancel(done, total):
        raise Cancelled

    real = os.preadv

    def slow(fd, buffers, offset):
        time.sleep(0.002)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", slow)
    with pytest.raises(Cancelled):
        load_weights(path, CPU, chunk_bytes=4096, threads=1, progress=cancel, progress_interval=0.001)
    gc.collect()
    assert [r for r in refs if r() is not None] == []


def test_never_unpickles(model, monkeypatch):
    path, tensors = model

    def boom(*a, **k):
        raise AssertionError("the loader must never unpickle")

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "Unpickler", boom)
    monkeypatch.setattr(torch, "load", boom)
    assert_same(load_weights(path, CPU), tensors)


def test_staged_pool_is_bounded(model, monkeypatch):
    path, tensors = model
    sizes: list[int] = []
    real = loader.ReadRing

    class Spy(real):
        def __init__(self, chunk_bytes, depth, device, **kw):
            sizes.append(chunk_bytes * depth)
            super().__init__(chunk_bytes, depth, device, **kw)

    monkeypatch.setattr(loader, "ReadRing", Spy)
    got = load_weights(path, CPU, staged=True, threads=2, chunk_bytes=1 << 20, pool_bytes=64 * 1024)
    assert_same(got, tensors)
    assert sizes and sum(sizes) <= 64 * 1024


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_load(model):
    path, tensors = model
    got = load_weights(path, torch.device("cuda:0"), chunk_bytes=4096, threads=2)
    assert all(t.device.type == "cuda" for t in got.values())
    assert_same({k: v.cpu() for k, v in got.items()}, tensors)


@pytest.mark.parametrize("staged", [False, True])
def test_failed_load_returns_its_memory(tmp_path, monkeypatch, staged):
    """The bytes a failed load touched go back, even while its exception is still held."""
    psutil = pytest.importorskip("psutil")
    path = tmp_path / "big.safetensors"
    # Each tensor above glibc's largest mmap threshold (32 MiB), so freeing it unmaps it at once.
    save_file({"a": torch.ones(40 << 20, dtype=torch.uint8), "b": torch.ones(40 << 20, dtype=torch.uint8)}, path)
    proc = psutil.Process()
    gc.collect()
    before = proc.memory_info().rss
    monkeypatch.setattr(os, "preadv", CountingPreadv(fail_after=60))  # 60 MiB read, then EIO
    with pytest.raises(LoadError) as err:
        load_weights(path, CPU, chunk_bytes=1 << 20, threads=1, staged=staged)
    gc.collect()
    grown = proc.memory_info().rss - before
    assert err.value.__traceback__ is not None
    assert grown < 16 << 20, f"a failed load kept {grown} bytes"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA guard")
def test_cuda_target_without_cuda_is_a_clear_error(model):
    path, _ = model
    with pytest.raises(LoadError, match=r"cuda:0.*torch.cuda.is_available\(\) is False"):
        load_weights(path, "cuda:0")


def test_allocation_failure_is_a_load_error_and_frees(model, monkeypatch):
    path, _ = model
    refs = track_allocations(monkeypatch)
    real = loader._allocate
    count = {"n": 0}

    def failing(*args):
        count["n"] += 1
        if count["n"] == 5:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(*args)

    monkeypatch.setattr(loader, "_allocate", failing)
    with pytest.raises(LoadError, match=r"allocating tensor '.+' \(\d+ bytes\) on cpu failed.*simulated"):
        load_weights(path, CPU)
    gc.collect()
    assert [r for r in refs if r() is not None] == []


def test_file_changed_after_its_header_was_read(model):
    path, _ = model
    header = read_header(path)
    with open(path, "ab") as f:
        f.write(b"\0" * 64)
    with pytest.raises(LoadError, match="changed during the load"):
        load_weights([header], CPU)
    path.unlink()
    with pytest.raises(LoadError, match="cannot open"):
        load_weights([header], CPU)


def test_a_file_swapped_after_its_header_was_read_is_refused_at_open(tmp_path):
    # The catalog (and the header read) saw a whole file inside the roots; by the time the bytes are read
    # it is another file, or a symlink out of the roots: refused when opened, before a byte is read.
    root = tmp_path / "models"
    root.mkdir()
    roots = [root.resolve()]
    path = root / "model.safetensors"
    save_file({"w": torch.ones(64)}, path)
    header = read_header(path, roots)
    other = tmp_path / "other.safetensors"
    save_file({"w": torch.full((64,), 7.0)}, other)  # same size, other bytes
    os.replace(other, path)
    with pytest.raises(LoadError, match="is another file now"):
        load_weights([header], CPU, roots=roots)
    secret = tmp_path / "passwd"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 4)
    path.unlink()
    path.symlink_to(secret)
    with pytest.raises(LoadError, match="outside the model roots") as info:
        load_weights([header], CPU, roots=roots)
    assert "root:x" not in str(info.value)
    with pytest.raises(SafetensorsError, match="outside the model roots"):
        load_weights(path, CPU, roots=roots)  # read from the start: refused at the header's open


def test_stripes_hand_out_each_chunk_once_in_order_and_share_the_tail():
    s = loader._Stripes(10, 3)
    got = [s.take(0) for _ in range(3)]
    assert got == [(0, 1), (1, 2), (2, None)]  # thread 0's stripe, in order, then its end
    # thread 0 is done with its stripe: it takes the back half of the longest remaining one
    taken = [g[0] for g in got]
    while (g := s.take(0)) is not None:
        taken.append(g[0])
    assert sorted(taken) == list(range(10))  # one thread alone can finish the whole plan
    assert s.take(1) is None and s.take(2) is None

    s = loader._Stripes(1000, 4)
    seen: list[int] = []
    lock = threading.Lock()

    def run(t):
        while (g := s.take(t)) is not None:
            with lock:
                seen.append(g[0])

    ts = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(seen) == list(range(1000))


def test_bench_registers_under_prewarm_bench_load():
    import argparse

    from bench import load as bench

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    bench.register(sub)
    args = parser.parse_args(["bench", "load", "--size", "64MiB", "--runs", "3", "--json"])
    assert args.size == 64 << 20 and args.runs == 3 and args.json and args.func is bench.cmd_bench_load
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "load", "--size", "lots"])


def test_shards_are_read_side_by_side_each_file_forward(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(5)
    files = []
    for s in range(2):
        f = tmp_path / f"s{s}.safetensors"
        save_file({f"t{s}": torch.randn(64 * 1024, generator=g)}, f)  # 256 KiB each
        files.append(f)
    reads: list[tuple[str, str, int]] = []
    lock = threading.Lock()
    real = os.preadv

    def spy(fd, buffers, offset):
        with lock:
            reads.append((threading.current_thread().name, os.readlink(f"/proc/self/fd/{fd}"), offset))
        time.sleep(0.005)  # slow storage: long enough for both threads to start (no timing is asserted)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", spy)
    load_weights(files, CPU, threads=2, chunk_bytes=16 * 1024)
    first = {}
    for thread, path, _ in reads:
        first.setdefault(thread, path)
    assert sorted(first.values()) == sorted(str(f) for f in files)  # one thread per shard at the start
    per_stream: dict[tuple[str, str], list[int]] = {}
    for thread, path, off in reads:
        per_stream.setdefault((thread, path), []).append(off)
    for offsets in per_stream.values():
        assert offsets == sorted(offsets)  # every thread walks each file forward


def _thp_mode() -> str | None:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else None


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off here")
def test_large_destinations_are_huge_page_backed(tmp_path):
    """The MADV_HUGEPAGE advice takes effect: a big tensor's memory is mostly 2 MiB pages once loaded."""
    from gpu_worker.hostmem import HUGE_PAGE_BYTES, huge_page_bytes

    path = tmp_path / "big.safetensors"
    # Above glibc's largest mmap threshold (32 MiB): the tensor has its own mapping, so smaps is exact.
    want = torch.randint(0, 256, (48 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    save_file({"w": want}, path)
    t = load_weights(path, CPU)["w"]
    got = huge_page_bytes(t)
    assert got is not None
    # The unaligned ends (under 2 MiB each) stay in 4 KiB pages; allow a few huge pages more for a
    # kernel short of free 2 MiB blocks.
    assert got >= t.numel() - 2 * HUGE_PAGE_BYTES - 4 * HUGE_PAGE_BYTES, f"{got} of {t.numel()} bytes in huge pages"
    assert torch.equal(t, want)


def test_prefault_makes_fresh_memory_resident_before_any_write():
    psutil = pytest.importorskip("psutil")
    from gpu_worker.hostmem import prefault

    proc = psutil.Process()
    t = torch.empty(64 << 20, dtype=torch.uint8)  # own mapping: nothing of it is resident yet
    before = proc.memory_info().rss
    prefault(t)
    assert proc.memory_info().rss - before > 60 << 20
    t.fill_(7)  # still ordinary writable memory
    assert int(t[-1]) == 7
