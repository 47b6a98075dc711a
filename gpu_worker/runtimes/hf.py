"""The `transformers` runtime: a replica is a Hugging Face checkpoint directory, hosted in the worker.

- required_bytes: config.json parsed by transformers (AutoConfig, local files only), the module built
  from it on the meta device (no memory, no random init), and the weights' headers checked against the
  module's parameters (names, dtypes, shapes) — so every bad input fails before a byte is reserved:
  MissingConfig, UnknownArchitecture, ShapeMismatch (runtimes/errors.py).
- load: prewarm's streaming safetensors loader (gpu_worker/loader.load_weights) straight into tensors on
  the device, assigned into the meta module (tied weights shared again, non-persistent buffers such as
  rotary frequencies computed on the device). No hub, no network, nothing unpickled.
- warm: each declared {prompt_tokens, batch} as a forward pass over deterministic token ids until its
  latency is stable (runtimes/warmup.py).
- serve: {"prompt": text, "max_tokens": n} generates greedily with the checkpoint's tokenizer;
  {"input_ids": [[...]]} or {"prompt_tokens", "batch"} runs a forward pass and summarises the logits.
- measure: the bytes of every storage the module holds; release: drop it and hand the memory back.
- model roots (spec.roots): every file of the directory is checked inside them before transformers opens
  config.json and again before it opens the tokenizer files; the weights at each open (runtimes/checkpoint.py).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch

from gpu_worker.device import module_bytes, trim_host_memory
from gpu_worker.errors import Cancelled, WarmupDoesNotFit
from gpu_worker.loader import TORCH_DTYPES, LoadError, load_weights
from gpu_worker.runtimes import CheckCancel, Progress, ReplicaSpec
from gpu_worker.runtimes.checkpoint import Checkpoint, check_files, read_checkpoint
from gpu_worker.runtimes.errors import (
    BadServeRequest,
    CheckpointError,
    EngineWarmupFailed,
    ShapeMismatch,
    UnknownArchitecture,
)
from gpu_worker.runtimes.warmup import run_until_stable
from gpu_worker.runtimes.warmup_memory import OverBudget, WarmupMemory, input_bytes, not_warmed
from prewarm.catalog_bounds import MAX_INPUT_TOKENS  # the catalog's warmup bound: one rule for both
from prewarm.safetensors_header import SafetensorsError

MAX_NEW_TOKENS = 256

log = logging.getLogger("prewarm.worker")


def _fmt(dtype: torch.dtype, shape: tuple[int, ...] | list[int]) -> str:
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


def build_meta_model(ck: Checkpoint, where: str) -> torch.nn.Module:
    """The module the checkpoint's config describes, on the meta device, in the config's dtype."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(ck.path, local_files_only=True, trust_remote_code=False)
    except (ValueError, KeyError) as exc:
        raise UnknownArchitecture(f"{where}: transformers {transformers.__version__} does not know the "
                                  f"architecture of {ck.path / 'config.json'} (model_type "
                                  f"{ck.model_type or 'missing'!r}): {_first_line(exc)}") from None
    except OSError as exc:
        raise CheckpointError(f"{where}: cannot read the config of {ck.path}: {_first_line(exc)}") from None
    dtype = getattr(config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    archs = list(getattr(config, "architectures", None) or [])
    cls = getattr(transformers, archs[0], None) if archs else None
    if archs and cls is None:
        raise UnknownArchitecture(f"{where}: transformers {transformers.__version__} has no class "
                                  f"{archs[0]!r} (config.json `architectures`)")
    try:
        with torch.device("meta"):
            if cls is not None:
                model = cls._from_config(config, dtype=dtype)
            else:
                model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except ValueError as exc:
        raise UnknownArchitecture(f"{where}: transformers cannot build a causal LM from {ck.path / 'config.json'}: "
                                  f"{_first_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - a config transformers accepts but cannot build from
        raise CheckpointError(f"{where}: building the module from {ck.path / 'config.json'} failed: "
                              f"{type(exc).__name__}: {_first_line(exc)}") from None
    model.eval()
    model.requires_grad_(False)
    return model


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def tied_groups(model: torch.nn.Module) -> list[list[str]]:
    """The state-dict names of each distinct tensor (tied weights share one group), first name first."""
    persistent = set(model.state_dict())
    groups: dict[int, list[str]] = {}
    for name, t in list(model.named_parameters(remove_duplicate=False)) + \
            list(model.named_buffers(remove_duplicate=False)):
        if name in persistent:
            groups.setdefault(id(t), []).append(name)
    return list(groups.values())


def check_weights(model: torch.nn.Module, ck: Checkpoint, where: str) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """The weights' tensors checked against the module; returns {name: (dtype, shape)} of the names the
    files hold (what the loader then verifies again as it reads). ShapeMismatch lists what disagrees."""
    found = {name: e for h in ck.weights.headers for name, e in h.tensors.items()}
    sd = model.state_dict()
    problems: list[str] = []
    for group in tied_groups(model):
        if not any(n in found for n in group):
            problems.append(f"{group[0]!r} is missing from the weights")
    for name, e in found.items():
        if name not in sd:
            problems.append(f"{name!r} is in the weights but not in the module")
            continue
        want = (sd[name].dtype, tuple(sd[name].shape))
        got = (TORCH_DTYPES.get(e.dtype), tuple(e.shape))
        if got != want:
            problems.append(f"{name!r}: the config gives {_fmt(*want)}, the weights hold "
                            f"{e.dtype.lower()}{list(e.shape)}")
    if problems:
        shown = problems[:5] + ([f"... and {len(problems) - 5} more"] if len(problems) > 5 else [])
        raise ShapeMismatch(f"{where}: the weights in {ck.path} disagree with its config.json: " + "; ".join(shown)
                            + " — the config and the weights must come from the same model")
    return {n: (sd[n].dtype, tuple(sd[n].shape)) for n in found}


def _set_tensor(model: torch.nn.Module, name: str, t: torch.Tensor) -> None:
    owner, _, attr = name.rpartition(".")
    mod = model.get_submodule(owner) if owner else model
    if attr in mod._parameters:
        mod._parameters[attr] = t if isinstance(t, torch.nn.Parameter) else torch.nn.Parameter(t, requires_grad=False)
    else:  # a persistent buffer
        mod._buffers[attr] = t


def materialize_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Non-persistent buffers (not in the weights: rotary frequencies and the like) are computed as
    transformers computes them after its own meta-device load: given real memory on the device, then set
    by the model's `_init_weights` for each module that owns one. Every loaded tensor is flagged
    `_is_hf_initialized` first, which transformers' init functions honour: no loaded weight is touched."""
    owners = sorted({name.rpartition(".")[0] for name, b in model.named_buffers() if b.device.type == "meta"})
    if not owners:
        return
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type != "meta":
            t._is_hf_initialized = True  # type: ignore[attr-defined]
    init = getattr(model, "_init_weights", None)
    if init is None:
        raise CheckpointError(f"{type(model).__name__} has buffers that are not in the weights "
                              f"({owners[0] or 'the model'}) and no _init_weights to compute them")
    with torch.no_grad():
        for owner in owners:
            mod = model.get_submodule(owner) if owner else model
            for attr, b in list(mod._buffers.items()):
                if b is not None and b.device.type == "meta":
                    mod._buffers[attr] = torch.empty(b.shape, dtype=b.dtype, device=device)
            init(mod)


class HFRuntime:
    """One Hugging Face checkpoint hosted in the worker process; see the module docstring."""

    name = "transformers"
    remeasure_seconds: float | None = None  # in the worker's process: its bytes change only by load
    endpoint: str | None = None

    def __init__(self, spec: ReplicaSpec, *, threads: int | None = None) -> None:
        self.spec = spec
        self.threads = threads
        self.device = torch.device(spec.device)
        self.model: torch.nn.Module | None = None
        self.tokenizer: Any = None
        self.vocab = 2
        self._checkpoint: Checkpoint | None = None
        self._meta: torch.nn.Module | None = None
        self._expected: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        self._groups: list[list[str]] = []
        self._lock = threading.Lock()  # generate() is not re-entrant on one module's caches

    def required_bytes(self) -> int:
        # Every file checked inside the model roots now: transformers opens config.json by name next.
        ck = read_checkpoint(self.spec.path, self.spec.where, self.spec.roots)
        meta = build_meta_model(ck, self.spec.where)
        self._expected = check_weights(meta, ck, self.spec.where)
        self._groups = tied_groups(meta)
        self._checkpoint, self._meta = ck, meta
        self.vocab = int(getattr(meta.config, "vocab_size", 2) or 2)
        return ck.data_bytes

    def load(self, progress: Progress | None = None, check_cancel: CheckCancel | None = None) -> int:
        if self._meta is None:
            self.required_bytes()
        assert self._meta is not None and self._checkpoint is not None
        model, self._meta = self._meta, None

        def report(done: int, total: int) -> None:
            if check_cancel is not None:
                check_cancel()  # raising here stops the read; the loader frees what it allocated
            if progress is not None:
                progress(done, total)

        try:
            tensors = load_weights(self.spec.path, self.device, progress=report, expected=self._expected,
                                   threads=self.threads, roots=self.spec.roots)  # each file checked at its open
        except Cancelled:
            raise
        except (SafetensorsError, LoadError) as exc:
            raise CheckpointError(f"{self.spec.where}: loading {self.spec.path}: {exc}") from None
        try:
            for group in self._groups:
                # The file holds one name of a tied group (or each, untied): every name gets its tensor.
                first = tensors[next(n for n in group if n in tensors)]
                wrapped: dict[int, torch.Tensor] = {}
                for n in group:
                    t = tensors.get(n, first)
                    if _is_param(model, n):
                        t = wrapped.setdefault(id(t), torch.nn.Parameter(t, requires_grad=False))
                    _set_tensor(model, n, t)
            tensors.clear()
            materialize_buffers(model, self.device)
        except Exception as exc:  # noqa: BLE001
            tensors.clear()
            raise CheckpointError(f"{self.spec.where}: assembling the module from {self.spec.path}: "
                                  f"{type(exc).__name__}: {exc}") from None
        still_meta = [n for n, t in list(model.named_parameters()) + list(model.named_buffers())
                      if t.device.type == "meta"]
        if still_meta:
            raise CheckpointError(f"{self.spec.where}: {len(still_meta)} tensor(s) have no weights, e.g. "
                                  f"{still_meta[0]!r}")
        tokenizer = None
        if self._checkpoint.has_tokenizer:
            # transformers opens the tokenizer files by name: checked inside the roots again, after the read.
            check_files(self.spec.path, self.spec.roots, self.spec.where)
            tokenizer = _load_tokenizer(self._checkpoint, self.spec.where)
        self.model, self.tokenizer = model, tokenizer  # only a whole replica is kept
        return self.measure()

    def warm(self, check_cancel: CheckCancel | None = None) -> list[dict[str, Any]]:
        out = []
        for i, w in enumerate(self.spec.warmup):
            where = f"warmup entry #{i} ({w.prompt_tokens} tokens x {w.batch})"
            # Its token ids and activations count against the device while it warms (as the torch runtime's).
            memory = WarmupMemory(self.spec.budget, f"{self.spec.where}: {where}", self.device)
            try:
                memory.reserve_input(input_bytes((w.batch, w.prompt_tokens), torch.long))
                ids = self._ids(w.batch, w.prompt_tokens, seed=i)

                def one(ids: torch.Tensor = ids, where: str = where) -> None:
                    try:
                        self._forward(ids)
                    except OverBudget:
                        raise  # the memory meter stopped the pass: WarmupMemory says why
                    except Exception as exc:  # noqa: BLE001
                        raise EngineWarmupFailed(f"{self.spec.where}: {where} failed: {type(exc).__name__}: "
                                                 f"{exc}") from None

                fig = {**run_until_stable(memory.metered(one), self.spec.policy, check_cancel),
                       "peak_bytes": memory.peak_bytes}
            except WarmupDoesNotFit as exc:
                log.warning("%s", exc)
                fig = not_warmed({}, exc)
            finally:
                memory.release()
            out.append({"prompt_tokens": w.prompt_tokens, "batch": w.batch, **fig})
        return out

    def serve(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.model is None:
            raise BadServeRequest(f"{self.spec.where}: the replica is not loaded")
        if not isinstance(request, dict):
            raise BadServeRequest(f"{self.spec.where}: a request is a table: {{\"prompt\": text, \"max_tokens\": n}}, "
                                  "{\"input_ids\": [[...]]} or {\"prompt_tokens\": n, \"batch\": b}")
        if "prompt" in request:
            return self._generate(request)
        if "input_ids" in request:
            try:
                ids = torch.tensor(request["input_ids"], dtype=torch.long)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise BadServeRequest(f"{self.spec.where}: input_ids must be lists of token ids: {exc}") from None
            if ids.dim() == 1:
                ids = ids.unsqueeze(0)
            if ids.dim() != 2 or ids.numel() == 0 or ids.numel() > MAX_INPUT_TOKENS:
                raise BadServeRequest(f"{self.spec.where}: input_ids must be a non-empty [batch][tokens] list of at "
                                      f"most {MAX_INPUT_TOKENS} ids")
            if int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
                raise BadServeRequest(f"{self.spec.where}: token ids must be in [0, {self.vocab})")
        else:
            n, b = request.get("prompt_tokens", 16), request.get("batch", 1)
            if not (isinstance(n, int) and isinstance(b, int) and n > 0 and b > 0 and n * b <= MAX_INPUT_TOKENS):
                raise BadServeRequest(f"{self.spec.where}: prompt_tokens and batch must be positive integers "
                                      f"(at most {MAX_INPUT_TOKENS} tokens in all)")
            ids = self._ids(b, n, seed=int(request.get("seed", 0)))
        t0 = time.perf_counter()
        logits = self._forward(ids.to(self.device))
        latency = time.perf_counter() - t0
        last = logits[:, -1, :].float()
        return {"model": self.spec.model, "latency_ms": round(latency * 1000, 3), "latency_seconds": latency,
                "input": {"batch": int(ids.shape[0]), "tokens": int(ids.shape[1])},
                "output": {"shape": list(logits.shape), "finite": bool(torch.isfinite(last).all()),
                           "next_tokens": [int(i) for i in last.argmax(-1)]}}

    def measure(self) -> int:
        return module_bytes(self.model) if self.model is not None else 0

    def died(self) -> str | None:
        return None  # in the worker's own process: it lives as long as the worker

    def release(self) -> int:
        freed = self.measure()
        self.model = None
        self._meta = None
        self.tokenizer = None
        trim_host_memory()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return freed

    # --- helpers ----------------------------------------------------------------------------------
    def _ids(self, batch: int, tokens: int, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, self.vocab, (batch, tokens), generator=gen).to(self.device)

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        assert self.model is not None
        with torch.inference_mode():
            out = self.model(input_ids=ids, use_cache=False)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return out.logits

    def _generate(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.model is not None
        if self.tokenizer is None:
            raise BadServeRequest(f"{self.spec.where}: the checkpoint has no tokenizer files, so text prompts "
                                  "cannot be served; send input_ids instead")
        prompt, n = request["prompt"], request.get("max_tokens", 16)
        if not isinstance(prompt, str) or not prompt:
            raise BadServeRequest(f"{self.spec.where}: prompt must be a non-empty string")
        if not (isinstance(n, int) and 0 < n <= MAX_NEW_TOKENS):
            raise BadServeRequest(f"{self.spec.where}: max_tokens must be an integer in 1..{MAX_NEW_TOKENS}")
        enc = self.tokenizer(prompt, return_tensors="pt")
        ids = enc["input_ids"].to(self.device)
        t0 = time.perf_counter()
        with self._lock, torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=enc["attention_mask"].to(self.device),
                                      max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id)
        latency = time.perf_counter() - t0
        new = out[0, ids.shape[1]:]
        return {"model": self.spec.model, "latency_ms": round(latency * 1000, 3), "latency_seconds": latency,
                "text": self.tokenizer.decode(new, skip_special_tokens=True),
                "usage": {"prompt_tokens": int(ids.shape[1]), "completion_tokens": int(new.numel())}}


def _is_param(model: torch.nn.Module, name: str) -> bool:
    owner, _, attr = name.rpartition(".")
    return attr in (model.get_submodule(owner) if owner else model)._parameters


def _load_tokenizer(ck: Checkpoint, where: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(ck.path, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"{where}: the tokenizer files in {ck.path} cannot be loaded: "
                              f"{type(exc).__name__}: {_first_line(exc)}") from None
