"""prewarm.safetensors_header: validation of real and deliberately broken safetensors files."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from prewarm.safetensors_header import (
    INDEX_FILENAME,
    MAX_HEADER_BYTES,
    MAX_TENSORS_PER_FILE,
    MAX_TENSORS_PER_INDEX,
    SafetensorsError,
    read_header,
    read_index,
    read_weight_set,
    weight_files,
)
from tests.model_files import HOSTILE, hostile_json, write_hostile_header


def craft(path: Path, header: dict, data: bytes, *, header_len: int | None = None) -> Path:
    """Write a safetensors-shaped file with an arbitrary header (to build broken files)."""
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data)
    return path


def sample(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    tensors = {
        "w": torch.randn(5, 7),
        "b16": torch.randn(3, 2).to(torch.bfloat16),
        "ids": torch.arange(11, dtype=torch.int64),
        "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5, dtype=torch.float16),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, path, metadata={"format": "pt", "note": "x"})
    return path, tensors


def test_reads_what_save_file_wrote(tmp_path):
    path, tensors = sample(tmp_path)
    h = read_header(path)
    assert h.path == path
    assert h.file_size == path.stat().st_size
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert h.data_offset == 8 + n
    assert h.metadata == {"format": "pt", "note": "x"}
    assert set(h.tensors) == set(tensors)
    names = {"F32": torch.float32, "BF16": torch.bfloat16, "I64": torch.int64, "BOOL": torch.bool, "F16": torch.float16}
    for name, t in tensors.items():
        e = h.tensors[name]
        assert e.name == name
        assert names[e.dtype] == t.dtype
        assert e.shape == tuple(t.shape)
        assert e.end - e.begin == t.numel() * t.element_size()
    assert h.data_bytes == sum(t.numel() * t.element_size() for t in tensors.values())
    assert h.data_offset + h.data_bytes == h.file_size
    # entries come in data-section order
    begins = [e.begin for e in h.tensors.values()]
    assert begins == sorted(begins)


def test_module_does_not_import_torch():
    code = "import sys, prewarm.safetensors_header; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_error_is_a_value_error_naming_the_file(tmp_path):
    path = tmp_path / "nope.safetensors"
    with pytest.raises(ValueError, match="nope.safetensors.*not found"):
        read_header(path)


def test_truncated_data_names_the_tensor_past_eof(tmp_path):
    path, _ = sample(tmp_path)
    data = path.read_bytes()
    h = read_header(path)
    last = max(h.tensors.values(), key=lambda e: e.end)
    path.write_bytes(data[:-3])
    with pytest.raises(SafetensorsError, match="truncated") as err:
        read_header(path)
    assert f"tensor {last.name!r}" in str(err.value)
    assert str(path) in str(err.value)
    assert err.value.path == path


def test_truncated_inside_the_header(tmp_path):
    path, _ = sample(tmp_path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(SafetensorsError, match="header length.*runs past the end"):
        read_header(path)


def test_too_short_for_a_length(tmp_path):
    path = tmp_path / "tiny.safetensors"
    path.write_bytes(b"abc")
    with pytest.raises(SafetensorsError, match="too short"):
        read_header(path)


def test_absurd_header_length(tmp_path):
    path = craft(tmp_path / "x.safetensors", {}, b"", header_len=1 << 40)
    with pytest.raises(SafetensorsError, match="header length"):
        read_header(path)


def test_not_a_safetensors_file(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\x80\x04\x95" + b"\x00" * 64)  # a pickle's first bytes: refused, never unpickled
    with pytest.raises(SafetensorsError):
        read_header(path)


def test_a_file_of_other_bytes_is_named_without_echoing_them(tmp_path):
    # /etc/passwd's first 8 bytes read as a little-endian length are 3475222254926655346: quoting the
    # "header length" would quote the file (issue 17) to anyone who reads the event log.
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 4)
    with pytest.raises(SafetensorsError, match="not a safetensors file") as info:
        read_header(path)
    assert str(struct.unpack("<Q", b"root:x:0")[0]) not in str(info.value)
    # a first u64 that is a plausible length but runs past the end: the length is not quoted either
    path.write_bytes(struct.pack("<Q", 777_777) + b"x" * 100)
    with pytest.raises(SafetensorsError, match="runs past the end of the 108-byte file") as info:
        read_header(path)
    assert "777777" not in str(info.value)


def test_roots_are_checked_when_each_file_is_opened(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    index, _, _ = write_sharded(root)
    roots = [root.resolve()]
    assert len(read_weight_set(index, roots).files) == 3  # everything inside: fine
    shard = root / "model-00002-of-00003.safetensors"
    secret = outside / "passwd"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 4)
    shard.unlink()
    shard.symlink_to(secret)  # swapped after the set was read once
    for read in (lambda: read_weight_set(index, roots), lambda: read_header(shard, roots)):
        with pytest.raises(SafetensorsError, match="outside the model roots") as info:
            read()
        assert shard.name in str(info.value) and "root:x" not in str(info.value)
    # an index that names a shard by a path leading out of the roots
    shard.unlink()
    save_file({"layer1.w": torch.zeros(8, 8), "layer1.b": torch.zeros(8)}, outside / "s.safetensors")
    text = index.read_text().replace('"model-00002-of-00003.safetensors"', '"../outside/s.safetensors"')
    index.write_text(text)
    assert len(read_weight_set(index).files) == 3  # without roots nothing is checked (tools, tests)
    with pytest.raises(SafetensorsError, match="outside the model roots"):
        read_weight_set(index, roots)
    # the index itself, symlinked out of the roots
    (outside / INDEX_FILENAME).write_text(text)
    index.unlink()
    index.symlink_to(outside / INDEX_FILENAME)
    with pytest.raises(SafetensorsError, match="outside the model roots"):
        weight_files(index, roots)


@pytest.mark.parametrize(
    "raw, match",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "expected an object"),
        (b"\xff\xfe{}", "UTF-8"),
    ],
)
def test_bad_header_text(tmp_path, raw, match):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(SafetensorsError, match=match):
        read_header(path)


HOSTILE_PROBLEM = {"deeply-nested": "JSON nested too deeply", "huge-integer": "integer of 5,000 digits"}


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_json_in_a_header_is_a_safetensors_error_naming_the_file(tmp_path, kind):
    # Before: RecursionError / ValueError (Python's int-string limit), which no caller catches.
    path = tmp_path / "evil.safetensors"
    write_hostile_header(path, kind)
    with pytest.raises(SafetensorsError, match=HOSTILE_PROBLEM[kind]) as err:
        read_header(path)
    assert str(err.value).startswith(f"{path}: header: ")


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_json_in_an_index_is_a_safetensors_error_naming_the_index(tmp_path, kind):
    index = tmp_path / INDEX_FILENAME
    index.write_bytes(hostile_json(kind).replace(b'{"w":', b'{"weight_map":', 1))
    for read in (read_index, weight_files, read_weight_set):
        with pytest.raises(SafetensorsError, match=HOSTILE_PROBLEM[kind]) as err:
            read(index)
        assert str(err.value).startswith(f"{index}: ")


def test_a_shape_of_many_huge_dimensions_is_refused_without_multiplying_them_out(tmp_path):
    # 50,000 dims of 2**64-1 would be a product of ~1,000,000 digits (and the last-dim 0 makes it 0 bytes).
    dims = [2**64 - 1] * 50_000
    path = craft(tmp_path / "dims.safetensors", {"a": {"dtype": "U8", "shape": dims, "data_offsets": [0, 1]}}, b"\0")
    with pytest.raises(SafetensorsError, match=r"tensor 'a'.*\(50000 dims\).*needs more than 2\*\*64 bytes"):
        read_header(path)
    zero = craft(tmp_path / "zero.safetensors", {"a": {"dtype": "U8", "shape": [*dims, 0], "data_offsets": [0, 0]}}, b"")
    assert read_header(zero).tensors["a"].numel == 0


def _many_tensors(path: Path, n: int, *, metadata: bool) -> Path:
    """A real file of n one-byte tensors (its header written directly: json.dumps of n dicts is slow)."""
    parts = [b'"__metadata__":{"format":"pt"}'] if metadata else []
    parts += [b'"t%d":{"dtype":"U8","shape":[1],"data_offsets":[%d,%d]}' % (i, i, i + 1) for i in range(n)]
    raw = b"{" + b",".join(parts) + b"}"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * n)
    return path


def test_a_file_of_more_tensors_than_the_bound_is_refused(tmp_path):
    n = MAX_TENSORS_PER_FILE
    assert len(read_header(_many_tensors(tmp_path / "at.safetensors", n, metadata=True)).tensors) == n
    over = _many_tensors(tmp_path / "over.safetensors", n + 1, metadata=False)
    with pytest.raises(SafetensorsError, match=rf"header: holds {n + 1:,} tensors; prewarm reads at most {n:,}"):
        read_header(over)
    # With more objects than the bound allows the parse stops early, before the whole header is objects.
    early = _many_tensors(tmp_path / "early.safetensors", n + 1, metadata=True)
    with pytest.raises(SafetensorsError, match=rf"header: holds more than {n:,} tensors"):
        read_header(early)


F32x4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}


@pytest.mark.parametrize(
    "header, data_len, match",
    [
        ({"a": {**F32x4, "dtype": "F33"}}, 16, r"tensor 'a' field 'dtype'.*unknown dtype 'F33'"),
        ({"a": {**F32x4, "shape": [5]}}, 16, r"tensor 'a'.*needs 20 bytes.*span 16"),
        ({"a": {**F32x4, "shape": [-4]}}, 16, r"tensor 'a' field 'shape'"),
        ({"a": {**F32x4, "shape": [True, 4]}}, 16, r"tensor 'a' field 'shape'"),
        ({"a": {**F32x4, "data_offsets": [16, 0]}}, 16, r"tensor 'a' field 'data_offsets'"),
        ({"a": {**F32x4, "data_offsets": [-16, 0]}}, 16, r"tensor 'a' field 'data_offsets'"),
        ({"a": {**F32x4, "data_offsets": [0]}}, 16, r"tensor 'a' field 'data_offsets'"),
        ({"a": {"dtype": "F32", "shape": [4]}}, 16, r"tensor 'a' field 'data_offsets'.*missing"),
        ({"a": {**F32x4, "extra": 1}}, 16, r"tensor 'a'.*unknown field"),
        ({"a": [1, 2]}, 16, r"tensor 'a'.*expected an object"),
        ({"__metadata__": {"k": 1}, "a": F32x4}, 16, r"__metadata__"),
        # offsets past the end of the file: the file holds 8 data bytes, 'a' claims 16
        ({"a": F32x4}, 8, r"tensor 'a'.*\[0, 16\] run past the end of the file.*holds 8 bytes"),
        # overlap: b starts inside a
        (
            {"a": F32x4, "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}},
            24,
            r"tensor 'b'.*overlap tensor 'a'",
        ),
        # aliasing: b is exactly a's bytes
        ({"a": F32x4, "b": F32x4}, 16, r"overlap"),
        # hole between tensors
        (
            {"a": F32x4, "b": {"dtype": "F32", "shape": [4], "data_offsets": [20, 36]}},
            36,
            r"tensor 'b'.*4-byte hole after tensor 'a'",
        ),
        # hole at the start
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [4, 20]}}, 20, r"hole at the start"),
        # bytes after the last tensor
        ({"a": F32x4}, 20, r"4 bytes follow the last tensor"),
    ],
)
def test_rejects_broken_headers(tmp_path, header, data_len, match):
    path = craft(tmp_path / "bad.safetensors", header, b"\0" * data_len)
    with pytest.raises(SafetensorsError, match=match) as err:
        read_header(path)
    assert str(path) in str(err.value)


def test_duplicate_tensor_names(tmp_path):
    raw = b'{"a": %s, "a": %s}' % (json.dumps(F32x4).encode(), json.dumps(F32x4).encode())
    path = tmp_path / "dup.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 16)
    with pytest.raises(SafetensorsError, match="tensor 'a'.*twice"):
        read_header(path)


def test_zero_sized_tensors_are_fine(tmp_path):
    header = {"e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]}, "a": F32x4}
    h = read_header(craft(tmp_path / "z.safetensors", header, b"\0" * 16))
    assert h.tensors["e"].nbytes == 0
    assert h.data_bytes == 16


def test_past_eof_is_rejected_reading_only_the_header(tmp_path, monkeypatch):
    """Validation reads the 8-byte length and the header, nothing of the data section."""
    path, _ = sample(tmp_path)
    path.write_bytes(path.read_bytes()[:-5])
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    reads: list[tuple[int, int]] = []
    real = os.pread

    def spy(fd, length, offset):
        reads.append((offset, length))
        return real(fd, length, offset)

    monkeypatch.setattr(os, "pread", spy)
    with pytest.raises(SafetensorsError, match="past the end"):
        read_header(path)
    assert reads and all(off + length <= 8 + n for off, length in reads)


# ---------------------------------------------------------------------------------------------
# sharded sets


def write_sharded(tmp_path: Path, shards: int = 3) -> tuple[Path, dict[str, torch.Tensor], dict[str, str]]:
    torch.manual_seed(1)
    tensors: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {f"layer{s}.w": torch.randn(8, 8), f"layer{s}.b": torch.randn(8)}
        save_file(part, tmp_path / name)
        tensors.update(part)
        weight_map.update({k: name for k in part})
    index = tmp_path / INDEX_FILENAME
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return index, tensors, weight_map


def test_read_index_and_weight_files(tmp_path):
    index, tensors, weight_map = write_sharded(tmp_path)
    mapping = read_index(index)
    assert mapping == {k: tmp_path / v for k, v in weight_map.items()}
    files = weight_files(index)
    assert files == [tmp_path / f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    assert weight_files(tmp_path) == files  # a directory with an index
    single = tmp_path / "single"
    single.mkdir()
    save_file({"x": torch.ones(2)}, single / "only.safetensors")
    assert weight_files(single / "only.safetensors") == [single / "only.safetensors"]
    assert weight_files(single) == [single / "only.safetensors"]


def test_weight_set_totals(tmp_path):
    index, tensors, _ = write_sharded(tmp_path)
    ws = read_weight_set(index)
    assert ws.tensor_count == len(tensors)
    assert ws.data_bytes == sum(t.numel() * t.element_size() for t in tensors.values())
    assert len(ws.files) == 3


def test_missing_shard_is_named(tmp_path):
    index, _, _ = write_sharded(tmp_path)
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(SafetensorsError, match=r"shard 'model-00002-of-00003.safetensors'.*missing shard") as err:
        read_index(index)
    assert "layer1.w" in str(err.value)
    with pytest.raises(SafetensorsError, match="model-00002-of-00003"):
        weight_files(index)


@pytest.mark.parametrize(
    "text, match",
    [("{oops", "not valid JSON"), ('{"metadata": {}}', "weight_map"), ('{"weight_map": {}}', "non-empty")],
)
def test_bad_index(tmp_path, text, match):
    index = tmp_path / INDEX_FILENAME
    index.write_text(text)
    with pytest.raises(SafetensorsError, match=match):
        read_index(index)


def test_an_index_over_the_bounds_is_refused(tmp_path):
    save_file({"x": torch.ones(2)}, tmp_path / "a.safetensors")
    index = tmp_path / INDEX_FILENAME
    index.write_text('{"weight_map": {' + ",".join(f'"t{i}":"a.safetensors"' for i in range(MAX_TENSORS_PER_INDEX + 1))
                     + "}}")
    with pytest.raises(SafetensorsError, match=rf"lists {MAX_TENSORS_PER_INDEX + 1:,} tensors; prewarm reads at most"):
        read_index(index)
    with open(index, "r+b") as f:  # sparse: no disk, refused on its size before a byte is read
        f.truncate(MAX_HEADER_BYTES + 1)
    with pytest.raises(SafetensorsError, match=rf"index is {MAX_HEADER_BYTES + 1:,} bytes; prewarm reads at most"):
        read_index(index)


def test_index_naming_a_tensor_its_shard_lacks(tmp_path):
    index, _, weight_map = write_sharded(tmp_path)
    weight_map["ghost"] = "model-00001-of-00003.safetensors"
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(SafetensorsError, match=r"tensor 'ghost'.*not in this shard"):
        read_weight_set(index)


def test_tensor_in_two_shards(tmp_path):
    index, _, weight_map = write_sharded(tmp_path)
    save_file({"layer0.w": torch.zeros(8, 8), "layer1.b": torch.zeros(8)}, tmp_path / "model-00002-of-00003.safetensors")
    with pytest.raises(SafetensorsError, match="layer0.w.*ambiguous"):
        read_weight_set(index)


def test_directory_without_an_index_and_several_files(tmp_path):
    save_file({"x": torch.ones(2)}, tmp_path / "a.safetensors")
    save_file({"y": torch.ones(2)}, tmp_path / "b.safetensors")
    with pytest.raises(SafetensorsError, match="2 .safetensors files"):
        weight_files(tmp_path)
