"""Small real catalogs for tests and benchmarks: real safetensors files with sizes of our choosing.

The policy and the web only need a catalog's ids and sizes; loading is tested with real models elsewhere.
A model's size is its safetensors data bytes, so a one-tensor file of N bytes makes a model of N bytes.
`sparse=True` writes the same file with its data as a hole (the safetensors header, then a truncate to the
full length): a valid file of N bytes that takes no disk, so a benchmark can have a catalog of 10,000
models of many GiB each. Its bytes read as zeros, as the dense file's do.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path


def _write_sparse(path: Path, size: int) -> None:
    # The safetensors layout: u64 little-endian header length, the JSON header (padded with spaces to a
    # multiple of 8, as safetensors itself pads it), then the tensor bytes.
    header = json.dumps({"pad": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + size)


def write_sized_catalog(folder: Path, sizes: dict[str, int], *, pinned: tuple[str, ...] = (),
                        min_replicas: dict[str, int] | None = None, sparse: bool = False) -> Path:
    """Models named by `sizes` ("id" or "id@version"), each a file of that many bytes (one uint8 tensor)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, size in sizes.items():
        mid, _, version = name.partition("@")
        version = version or "v1"
        path = folder / f"{mid}-{version}.safetensors"
        if sparse:
            _write_sparse(path, size)
        else:
            import torch  # only dense files need it (a sparse catalog of thousands of models does not)
            from safetensors.torch import save_file

            save_file({"pad": torch.zeros(size, dtype=torch.uint8)}, str(path))
        lines += ["[[models]]", f'id = "{mid}"', f'version = "{version}"', f'weights = "{path.name}"',
                  'builder = "gpu_worker.demo_models:build_mlp"',
                  f"pinned = {'true' if mid in pinned else 'false'}",
                  f"min_replicas = {(min_replicas or {}).get(mid, 0)}",
                  "[[models.warmup]]", "shape = [1, 784]", 'dtype = "float32"', ""]
    catalog = folder / "catalog.toml"
    catalog.write_text("\n".join(lines))
    return catalog
