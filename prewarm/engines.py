"""Which runtimes can host a replica, and where the engines that run as their own processes live.

No torch, no engine imported: `prewarm engines`, the catalog and the worker all ask here.

- `torch` and `transformers` run inside the worker, from prewarm's own environment.
- `vllm` runs as its own server process per replica, from its own environment (its pins would fight
  prewarm's): `scripts/install-vllm.sh` (or `prewarm engines install vllm`) makes it at
  $PREWARM_VLLM_VENV, default `~/.cache/prewarm/vllm-<version>` (outside the checkout, so every clone on
  the machine, CI's included, shares one 3.5 GB install), and writes a stamp file there last, so an
  environment with a stamp is a finished install.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from prewarm.config import repo_root

RUNTIMES = ("torch", "transformers", "vllm")
DEFAULT_KV_CACHE_BYTES = 256 << 20  # an engine's KV cache when the catalog gives none: enough for tiny models
# What a vLLM engine's processes hold beyond weights and KV cache (runtime, compiled graphs, activations):
# measured 1.93 GB for the 1.6 MB demo Llama on CPU (`prewarm bench engine`). Counted in the entry's size so
# the placement gives it a GPU it fits on (a smaller one fails when the engine measures itself).
DEFAULT_VLLM_ENGINE_BYTES = 2 << 30
INSTALLABLE = {"vllm": "scripts/install-vllm.sh"}
STAMP = ".prewarm-engine"  # written by the install script once the engine imports


def vllm_version() -> str:
    """The vLLM release the install script pins (its `VLLM_VERSION=` line: the pin has one home)."""
    text = (repo_root() / INSTALLABLE["vllm"]).read_text()
    return next(line.split("=", 1)[1].strip() for line in text.splitlines() if line.startswith("VLLM_VERSION="))


def vllm_venv(env: dict[str, str] | None = None) -> Path:
    """Where the vLLM environment is (the install script uses the same variable and default)."""
    e = os.environ if env is None else env
    if e.get("PREWARM_VLLM_VENV"):
        return Path(e["PREWARM_VLLM_VENV"])
    cache = Path(e.get("XDG_CACHE_HOME") or Path(e.get("HOME") or Path.home()) / ".cache")
    return cache / "prewarm" / f"vllm-{vllm_version()}"


def vllm_python(env: dict[str, str] | None = None) -> Path | None:
    """The vLLM environment's python when a finished install is there, else None."""
    venv = vllm_venv(env)
    py = venv / "bin" / "python"
    return py if py.is_file() and (venv / STAMP).is_file() else None


def install_script(name: str) -> Path:
    if name not in INSTALLABLE:
        raise ValueError(f"unknown engine {name!r}: installable engines are {', '.join(INSTALLABLE)}")
    return repo_root() / INSTALLABLE[name]


@dataclass(frozen=True)
class EngineStatus:
    name: str
    available: bool
    version: str | None
    where: str  # "in-process" or the engine environment's path
    detail: str  # what it runs as, or what to do to make it available
    host_tier: str = ""  # what its host tier (stage, promotion) is here, or why it has none

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


HOST_TIERS = {
    "torch": "the node's host cache: `stage` copies the weights to host memory, a preload promotes them",
    "transformers": "none: only torch models are staged in the host cache",
}
VLLM_HOST_TIER_CUDA = ("sleep level 1: `stage` puts a ready replica's engine to sleep (weights to host memory), "
                       "a preload on its GPU promotes it with wake_up")
VLLM_HOST_TIER_CPU = ("none on CPU: vLLM's host tier is its sleep mode, which vLLM does not support on CPU "
                      "(on a CUDA build: sleep level 1, wake_up to promote)")


def engine_status(name: str, env: dict[str, str] | None = None) -> EngineStatus:
    if name in ("torch", "transformers"):
        v = _dist_version(name)
        detail = "in the worker process" if v else f"not installed in prewarm's environment: pip install -e . installs {name}"
        return EngineStatus(name, v is not None, v, "in-process", detail, HOST_TIERS[name])
    if name == "vllm":
        venv = vllm_venv(env)
        py = vllm_python(env)
        if py is None:
            return EngineStatus(name, False, None, str(venv),
                                "not installed: run `prewarm engines install vllm` (or scripts/install-vllm.sh)",
                                VLLM_HOST_TIER_CPU)
        lines = (venv / STAMP).read_text().splitlines()
        # The stamp's second line: "vllm <version> (<flavor>)", written after `import vllm` worked.
        parts = lines[1].split() if len(lines) > 1 else []
        version = parts[1] if len(parts) > 1 else None
        flavor = parts[2].strip("()") if len(parts) > 2 else "?"
        return EngineStatus(name, True, version, str(venv), f"one OpenAI-compatible server process per replica ({flavor} build)",
                            VLLM_HOST_TIER_CUDA if flavor == "cuda" else VLLM_HOST_TIER_CPU)
    raise ValueError(f"unknown runtime {name!r}: runtimes are {', '.join(RUNTIMES)}")


def all_engines(env: dict[str, str] | None = None) -> list[EngineStatus]:
    return [engine_status(n, env) for n in RUNTIMES]
