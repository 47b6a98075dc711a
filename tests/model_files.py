"""Real tiny models on disk for worker tests: catalogs of the small demo models, and ways to break them.

    cat = tiny_catalog(tmp_path, ["tiny-lm", "tiny-sharded"])   # real weights + catalog.toml, a few MB
    truncate(file), corrupt_header(file), offsets_past_eof(file), retype_tensor(file, name, dtype),
    reshape_tensor(file, name), model_files(cat, "tiny-sharded"),
    hostile_json(kind), write_hostile_header(file, kind)   # JSON that breaks a naive parser
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from gpu_worker.demo_models import SMALL, DemoModel, catalog_entry, write_weights


def small_model(model_id: str, version: str = "v1") -> DemoModel:
    return next(m for m in SMALL if m.id == model_id and m.version == version)


def tiny_catalog(folder: Path, models: list[str] | None = None, *, extra: str = "") -> Path:
    """Write the named small demo models ("id" or "id@version"; default all) and a catalog for them."""
    folder.mkdir(parents=True, exist_ok=True)
    chosen = SMALL if models is None else [small_model(*m.split("@")) for m in models]
    parts = []
    for m in chosen:
        rel = f"{m.id}-{m.version}"
        weights = write_weights(m, folder / rel)
        parts.append(catalog_entry(m, f"{rel}/{weights}"))
    catalog = folder / "catalog.toml"
    catalog.write_text("\n".join(parts) + extra)
    return catalog


def model_files(catalog: Path, model_id: str, version: str = "v1") -> list[Path]:
    """The model's .safetensors files, in shard order."""
    return sorted((catalog.parent / f"{model_id}-{version}").glob("*.safetensors"))


def _split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _join(path: Path, header: dict, data: bytes) -> None:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def truncate(path: Path, keep: float = 0.5) -> None:
    """Cut the file short (a partial copy): the header stays, the data ends early."""
    size = path.stat().st_size
    header, _ = _split(path)
    hlen = 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]
    with open(path, "r+b") as f:
        f.truncate(max(hlen + 1, int(size * keep)))


def corrupt_header(path: Path) -> None:
    """Overwrite a few bytes inside the JSON header."""
    with open(path, "r+b") as f:
        f.seek(9)
        f.write(b"\xff\x00garbage")


def offsets_past_eof(path: Path) -> str:
    """Make the last tensor claim more bytes than the file holds (a consistent shape x dtype, no data);
    returns that tensor's name."""
    header, data = _split(path)
    name = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    e = header[name]
    begin, end = e["data_offsets"]
    e["shape"] = [e["shape"][0] * 2, *e["shape"][1:]]
    e["data_offsets"] = [begin, begin + 2 * (end - begin)]
    _join(path, header, data)
    return name


def retype_tensor(path: Path, name: str, dtype: torch.dtype = torch.float16) -> None:
    """Store one tensor in another dtype (a valid file that no longer matches the builder)."""
    tensors = load_file(str(path))
    tensors[name] = tensors[name].to(dtype)
    save_file(tensors, str(path))


def reshape_tensor(path: Path, name: str) -> None:
    """Drop the last row of one tensor (a valid file whose shape no longer matches the builder)."""
    tensors = load_file(str(path))
    tensors[name] = tensors[name][:-1].clone()
    save_file(tensors, str(path))


# JSON crafted against a parser rather than against the format (an outside probe, issue 24 finding 2.1):
# nesting past the recursion limit (a RecursionError in json.loads) and an integer past Python's
# int-string conversion limit of 4,300 digits (a plain ValueError).
HOSTILE = ("deeply-nested", "huge-integer")


def hostile_json(kind: str) -> bytes:
    if kind == "deeply-nested":  # 200,000 levels, 400 KB
        return b'{"w":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    if kind == "huge-integer":  # a 5 KB file
        return b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,' + b"1" * 5_000 + b"]}}"
    raise ValueError(f"unknown hostile JSON {kind!r}; one of {HOSTILE}")


def write_hostile_header(path: Path, kind: str) -> None:
    """Replace the file with a safetensors file whose header is hostile JSON (and one data byte)."""
    raw = hostile_json(kind)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0")
