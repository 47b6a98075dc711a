"""The `vllm-adapter` runtime: a LoRA adapter replica, loaded at run time into a ready vLLM base replica.

An adapter has no engine of its own (issue 29, item 2). Its replica lives on the GPU of a ready replica of
its base (the catalog's `base`), whose engine runs with LoRA enabled (vllm_engine.LoraSlots); the replica
record names that base replica in its `host` field ("model@version") and publishes the base's endpoint.

- required_bytes: the adapter's weight data bytes, from adapter_model.safetensors's header (read inside
  the model roots). That is also what it is measured to hold: vLLM keeps a loaded adapter in its CPU
  cache at about that size, and the GPU slot it runs in is allocated when the engine starts (max_loras x
  max_lora_rank), so it is inside the base replica's own measured footprint. Counting the adapter's
  bytes separately is a small overcount on purpose: the fleet, heartbeat and console show it held.
- load: every file of the adapter directory checked inside the roots (the engine opens them by name),
  then POST /v1/load_lora_adapter {"lora_name": <catalog id>, "lora_path": <dir>} on the base's engine:
  vLLM reads and validates the adapter then (engine_client.add_lora), so a bad adapter fails the load
  with the engine's own reason. The adapter is then served under its catalog id as the OpenAI `model`.
- warm: the adapter's warmup entries as /v1/completions requests with model = the adapter's name.
- serve: a /v1/completions request for the adapter.
- died: the base engine's reason once it exited, or that its engine is gone (the base was released).
- release: POST /v1/unload_lora_adapter (vLLM forgets the name; its slot is free for another adapter);
  nothing to do when the base engine is gone already. Idempotent.

The worker (gpu_worker/replica_runtimes.py) refuses an adapter whose base has no ready replica on the GPU, or
whose base replica's slots (max_adapters) are all taken; vLLM itself would accept more names than its
slots and swap them in and out on demand, which is exactly the load a preload is meant to have done.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gpu_worker.runtimes import CheckCancel, Progress, ReplicaSpec
from gpu_worker.runtimes.checkpoint import check_files
from gpu_worker.runtimes.errors import BadServeRequest, EngineFailed, ReleaseFailed
from gpu_worker.runtimes.vllm_engine import VllmRuntime
from prewarm.catalog import ADAPTER_WEIGHTS
from prewarm.safetensors_header import SafetensorsError, read_header

ADAPTER_CALL_TIMEOUT = 120.0  # seconds for the engine to load or unload an adapter (well under 1 s here)


class AdapterLoadFailed(EngineFailed):
    """The base engine refused the adapter (its own reason, e.g. a rank above --max-lora-rank)."""


class VllmAdapterRuntime:
    """One adapter loaded into one running vLLM engine; see the module docstring."""

    name = "vllm-adapter"
    remeasure_seconds: float | None = None  # its bytes are its weights': fixed once loaded

    def __init__(self, spec: ReplicaSpec, engine: VllmRuntime, host: str) -> None:
        self.spec = spec
        self.engine = engine
        self.host = host  # the base replica's "model@version"
        self.loaded = False
        self.bytes = 0
        self.timings: dict[str, float] = {}  # adapter_load_seconds, warmup_seconds
        self.source = "storage"

    @property
    def endpoint(self) -> str | None:
        return self.engine.endpoint if self.loaded else None

    def required_bytes(self) -> int:
        try:
            self.bytes = read_header(Path(self.spec.path) / ADAPTER_WEIGHTS, self.spec.roots).data_bytes
        except (SafetensorsError, OSError) as exc:
            raise EngineFailed(f"{self.spec.where}: adapter weights: {exc}") from None
        return self.bytes

    def load(self, progress: Progress | None = None, check_cancel: CheckCancel | None = None) -> int:
        need = self.bytes or self.required_bytes()
        if check_cancel is not None:
            check_cancel()
        self._check_engine("load")
        check_files(self.spec.path, self.spec.roots, self.spec.where)
        if progress:
            progress(0, need)
        t0 = time.perf_counter()
        self._post("/v1/load_lora_adapter", {"lora_name": self.spec.model, "lora_path": str(self.spec.path)},
                   AdapterLoadFailed)
        self.loaded = True
        self.timings["adapter_load_seconds"] = time.perf_counter() - t0
        if progress:
            progress(need, need)
        return self.measure()

    def warm(self, check_cancel: CheckCancel | None = None) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        try:
            out = self.engine.warm_entries(self.spec.warmup, self.spec.model, self.spec.where, self.spec.policy,
                                           check_cancel)
        except BaseException:
            self._unload_quietly()
            raise
        self.timings["warmup_seconds"] = time.perf_counter() - t0
        return out

    def serve(self, request: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(request, dict) or "prompt" not in request:
            raise BadServeRequest(f"{self.spec.where}: an adapter's request is a /v1/completions body with a "
                                  "`prompt`, e.g. {\"prompt\": \"Hello\", \"max_tokens\": 8}")
        self._check_engine("serve")
        t0 = time.perf_counter()
        answer = self.engine._completion({k: v for k, v in request.items() if k != "model"}, self.spec.model)
        latency = time.perf_counter() - t0
        choice = (answer.get("choices") or [{}])[0]
        return {"model": self.spec.model, "served_model": answer.get("model"), "base": self.host,
                "latency_ms": round(latency * 1000, 3), "latency_seconds": latency, "text": choice.get("text"),
                "usage": answer.get("usage"), "endpoint": self.endpoint}

    def measure(self) -> int:
        return self.bytes if self.loaded else 0

    def died(self) -> str | None:
        if not self.loaded:
            return None
        why = self.engine.died()
        if why is not None:
            return f"{self.spec.where}: its base {self.host}'s engine exited: {why}"
        if self.engine.proc is None:
            return f"{self.spec.where}: its base {self.host}'s engine is gone (released)"
        return None

    def release(self) -> int:
        if not self.loaded:
            return 0
        held = self.measure()
        if self.engine.proc is not None and self.engine.proc.poll() is None:
            try:
                self._post("/v1/unload_lora_adapter", {"lora_name": self.spec.model}, EngineFailed)
            except EngineFailed as exc:
                if "cannot be found" not in str(exc):  # already forgotten by the engine: nothing left
                    raise ReleaseFailed(f"{self.spec.where}: the engine did not unload the adapter: {exc}") from None
        self.loaded = False
        return held

    # --- the engine's runtime LoRA API --------------------------------------------------------------
    def _check_engine(self, what: str) -> None:
        e = self.engine
        if e.proc is None or e.port is None or e.proc.poll() is not None:
            raise EngineFailed(f"{self.spec.where}: cannot {what} the adapter: its base {self.host}'s engine is not "
                               "running")
        if e.lora is None:
            raise EngineFailed(f"{self.spec.where}: its base {self.host}'s engine was started without LoRA (no "
                               "adapters in the catalog then); evict the base and preload it again")

    def _post(self, path: str, body: dict[str, Any], error: type[EngineFailed]) -> str:
        assert self.engine.port is not None
        req = urllib.request.Request(f"http://127.0.0.1:{self.engine.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=ADAPTER_CALL_TIMEOUT) as r:
                return r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:2000]
            try:
                detail = json.loads(detail).get("error", {}).get("message") or detail
            except (ValueError, AttributeError):
                pass
            hint = (" (the engine has no runtime LoRA API: VLLM_ALLOW_RUNTIME_LORA_UPDATING is unset)"
                    if exc.code == 404 and "load_lora" in path else "")
            raise error(f"{self.spec.where}: POST {path} answered {exc.code}{hint}: {detail}",
                        self.engine._tail_if_dead()) from None
        except (urllib.error.URLError, OSError) as exc:
            raise error(f"{self.spec.where}: POST {path}: the engine did not answer: {exc}",
                        self.engine._tail_if_dead()) from None

    def _unload_quietly(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - the caller's error stands
            self.loaded = False
