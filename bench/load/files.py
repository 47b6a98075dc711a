"""The benchmark's model file (seeded, transformer-shaped safetensors): writing it, reading it raw (the
baseline contender, also how its pages are brought into the page cache) and dropping it from there."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
from pathlib import Path

GiB = float(1 << 30)
MiB = 1 << 20
# cat uses 128 KiB; 1 MiB reads measured faster here, so the baseline is the harder one to match.
RAW_BUFFER = 1 * MiB


def write_model(path: Path, size_bytes: int, seed: int = 0) -> int:
    """Write a transformer-shaped safetensors file of about ``size_bytes`` (fp16 weights, fp32
    norms), streaming tensor by tensor so the writer never holds two copies. Returns data bytes."""
    import torch

    d = 2048 if size_bytes >= 512 * MiB else 1024 if size_bytes >= 64 * MiB else 256
    vocab = 8 * d
    shapes: list[tuple[str, tuple[int, ...], torch.dtype]] = [("embed.weight", (vocab, d), torch.float16)]
    per_layer = 12 * d * d * 2 + 2 * d * 4 + 9 * d * 2
    layers = max(1, round((size_bytes - vocab * d * 2) / per_layer))
    for i in range(layers):
        p = f"layers.{i}."
        shapes += [
            (p + "attn.qkv.weight", (3 * d, d), torch.float16),
            (p + "attn.qkv.bias", (3 * d,), torch.float16),
            (p + "attn.out.weight", (d, d), torch.float16),
            (p + "attn.out.bias", (d,), torch.float16),
            (p + "norm1.weight", (d,), torch.float32),
            (p + "mlp.up.weight", (4 * d, d), torch.float16),
            (p + "mlp.up.bias", (4 * d,), torch.float16),
            (p + "mlp.down.weight", (d, 4 * d), torch.float16),
            (p + "mlp.down.bias", (d,), torch.float16),
            (p + "norm2.weight", (d,), torch.float32),
        ]
    names = {torch.float16: "F16", torch.float32: "F32"}
    header: dict[str, object] = {"__metadata__": {"format": "pt", "generator": "prewarm bench load", "seed": str(seed)}}
    offset = 0
    for name, shape, dtype in shapes:
        n = 1
        for s in shape:
            n *= s
        nbytes = n * (2 if dtype == torch.float16 else 4)
        header[name] = {"dtype": names[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the reference writer pads the header to 8 bytes
    gen = torch.Generator().manual_seed(seed)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for _name, shape, dtype in shapes:
            t = (torch.randn(shape, generator=gen) * 0.02).to(dtype)
            f.write(t.numpy().tobytes())
        f.flush()
        os.fsync(f.fileno())  # clean pages: DONTNEED can drop them for the cold runs
    return offset


# --------------------------------------------------------------------------------------------------
# page cache control


def drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_fraction(path: Path) -> float | None:
    """Fraction of the file's pages in the page cache (mincore), or None where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        size = path.stat().st_size
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
            page = mmap.PAGESIZE
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
            try:
                if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                    return None
                return sum(v & 1 for v in vec) / pages
            finally:
                del addr
    except (OSError, AttributeError, TypeError, BufferError):
        return None


def warm_page_cache(path: Path) -> None:
    raw_read(path)


def raw_read(path: Path) -> int:
    """`cat FILE > /dev/null`: sequential reads into one small reused buffer."""
    buf = bytearray(RAW_BUFFER)
    n = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while k := os.readv(fd, [buf]):
            n += k
    finally:
        os.close(fd)
    return n
