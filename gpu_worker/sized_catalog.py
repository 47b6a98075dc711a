"""Small real catalogs for tests and benchmarks: real safetensors files with sizes of our choosing.

The policy and the web only need a catalog's ids and sizes; loading is tested with real models elsewhere.
A model's size is its safetensors data bytes, so a one-tensor file of N bytes makes a model of N bytes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file


def write_sized_catalog(folder: Path, sizes: dict[str, int], *, pinned: tuple[str, ...] = (),
                        min_replicas: dict[str, int] | None = None) -> Path:
    """Models named by `sizes` ("id" or "id@version"), each a file of that many bytes (one uint8 tensor)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, size in sizes.items():
        mid, _, version = name.partition("@")
        version = version or "v1"
        path = folder / f"{mid}-{version}.safetensors"
        save_file({"pad": torch.zeros(size, dtype=torch.uint8)}, str(path))
        lines += ["[[models]]", f'id = "{mid}"', f'version = "{version}"', f'weights = "{path.name}"',
                  'builder = "gpu_worker.demo_models:build_mlp"',
                  f"pinned = {'true' if mid in pinned else 'false'}",
                  f"min_replicas = {(min_replicas or {}).get(mid, 0)}",
                  "[[models.warmup]]", "shape = [1, 784]", 'dtype = "float32"', ""]
    catalog = folder / "catalog.toml"
    catalog.write_text("\n".join(lines))
    return catalog
