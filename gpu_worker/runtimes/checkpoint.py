"""A Hugging Face checkpoint directory, checked without torch: config.json and the safetensors weights.

Both runtimes start here, so a checkpoint that cannot work fails with one clear reason before any memory
is reserved: `transformers` builds its module from the config, `vllm` hands the directory to its engine.
Weights are read by prewarm's own safetensors code (prewarm/safetensors_header.py): nothing unpickled,
no hub, no network.

Model roots (prewarm/model_roots.py): given the catalog's `roots`, config.json and every weights file
prewarm reads are checked as they are opened, and `check_files` checks every file of the directory (what
transformers and a vLLM engine open by name) right before they are handed it — at load time, not only when
the catalog was read, so a file swapped for a symlink out of the roots since is refused by name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_worker.runtimes.errors import CheckpointError, MissingConfig
from prewarm.model_roots import RefusedFile, check_tree, open_inside
from prewarm.safetensors_header import Roots, SafetensorsError, WeightSet, read_weight_set

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


def check_files(path: str | Path, roots: Roots, where: str = "") -> None:
    """Every file of the checkpoint directory inside the model roots now (model_roots.check_tree), for a
    reader that opens them by name; CheckpointError naming the file and the roots. `roots=None`: no check."""
    at = f"{where}: " if where else ""
    try:
        check_tree(path, roots)
    except RefusedFile as exc:
        raise CheckpointError(f"{at}checkpoint {path} refused: {exc}") from None
    except OSError as exc:
        raise CheckpointError(f"{at}checkpoint {path}: cannot check {exc.filename or path}: "
                              f"{exc.strerror or exc}") from None


def read_checkpoint(path: str | Path, where: str = "", roots: Roots = None) -> Checkpoint:
    """The checkpoint at `path`, its config parsed and every weight header validated; MissingConfig or
    CheckpointError (via SafetensorsError's message) saying what to fix. `roots`: the model roots every
    file of the directory must lie in (checked now: check_files, and each file prewarm reads at its open)."""
    p = Path(path)
    at = f"{where}: " if where else ""
    if not p.is_dir():
        raise MissingConfig(f"{at}checkpoint {p} is not a directory; a Hugging Face checkpoint is a directory "
                            f"with {CONFIG} and model.safetensors (or shards with model.safetensors.index.json)")
    check_files(p, roots, where)
    cfg_path = p / CONFIG
    if not cfg_path.is_file():
        raise MissingConfig(f"{at}checkpoint {p} has no {CONFIG}: write the model's config there "
                            "(transformers: config.save_pretrained(dir))")
    config = _read_config(cfg_path, roots, at)
    try:
        weights = read_weight_set(p, roots)
    except SafetensorsError as exc:
        raise CheckpointError(f"{at}weights of checkpoint {p}: {exc}") from None
    return Checkpoint(path=p, config=config, weights=weights)


def _read_config(cfg_path: Path, roots: Roots, at: str) -> dict[str, Any]:
    try:
        with os.fdopen(open_inside(cfg_path, roots), "rb") as f:
            config = json.loads(f.read())
    except RefusedFile as exc:
        raise CheckpointError(f"{at}{exc}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MissingConfig(f"{at}{cfg_path} cannot be read as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise MissingConfig(f"{at}{cfg_path} must hold a JSON object, not {type(config).__name__}")
    return config
