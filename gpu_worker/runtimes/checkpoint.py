"""A Hugging Face checkpoint directory, checked without torch: config.json and the safetensors weights.

Both runtimes start here, so a checkpoint that cannot work fails with one clear reason before any memory
is reserved: `transformers` builds its module from the config, `vllm` hands the directory to its engine.
Weights are read by prewarm's own safetensors code (prewarm/safetensors_header.py): nothing unpickled,
no hub, no network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_worker.runtimes.errors import CheckpointError, MissingConfig
from prewarm.safetensors_header import SafetensorsError, WeightSet, read_weight_set

CONFIG = "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    config: dict[str, Any]
    weights: WeightSet

    @property
    def data_bytes(self) -> int:
        return self.weights.data_bytes

    @property
    def has_tokenizer(self) -> bool:
        return any((self.path / f).is_file() for f in TOKENIZER_FILES)

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type") or "")


def read_checkpoint(path: str | Path, where: str = "") -> Checkpoint:
    """The checkpoint at `path`, its config parsed and every weight header validated; MissingConfig or
    CheckpointError (via SafetensorsError's message) saying what to fix."""
    p = Path(path)
    at = f"{where}: " if where else ""
    if not p.is_dir():
        raise MissingConfig(f"{at}checkpoint {p} is not a directory; a Hugging Face checkpoint is a directory "
                            f"with {CONFIG} and model.safetensors (or shards with model.safetensors.index.json)")
    cfg_path = p / CONFIG
    if not cfg_path.is_file():
        raise MissingConfig(f"{at}checkpoint {p} has no {CONFIG}: write the model's config there "
                            "(transformers: config.save_pretrained(dir))")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MissingConfig(f"{at}{cfg_path} cannot be read as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise MissingConfig(f"{at}{cfg_path} must hold a JSON object, not {type(config).__name__}")
    try:
        weights = read_weight_set(p)
    except SafetensorsError as exc:
        raise CheckpointError(f"{at}weights of checkpoint {p}: {exc}") from None
    return Checkpoint(path=p, config=config, weights=weights)
