"""The `transformers` runtime on a real tiny Llama checkpoint (random weights, local tokenizer), on CPU."""

from __future__ import annotations

import gc
import json
import shutil
import weakref
from pathlib import Path

import pytest
import torch

from gpu_worker.demo_hf import write_tiny_llama
from gpu_worker.errors import Cancelled, LoadFailed
from gpu_worker.runtimes import ReplicaSpec, Runtime, TokenWarmup
from gpu_worker.runtimes.errors import (
    BadServeRequest,
    CheckpointError,
    MissingConfig,
    ShapeMismatch,
    UnknownArchitecture,
)
from gpu_worker.runtimes.hf import HFRuntime
from gpu_worker.runtimes.warmup import WarmupPolicy
from prewarm.catalog import load_catalog
from prewarm.catalog_entries import ModelEntry
from prewarm.safetensors_header import read_weight_set

FAST = WarmupPolicy(min_passes=3, max_passes=4, max_seconds=2.0)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {"single": write_tiny_llama(root / "single", seed=1),
            "sharded": write_tiny_llama(root / "sharded", seed=1, shard_bytes=300_000)}


def spec(path: Path, **kw: object) -> ReplicaSpec:
    return ReplicaSpec(model="tiny-llama", version="v1", path=path, gpu="node/cpu:0", policy=FAST, **kw)  # type: ignore[arg-type]


def copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / "ckpt"))


def edit_config(path: Path, **changes: object) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def reference_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    """transformers' own loading of the same checkpoint (local files), for comparison."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.bfloat16)
    with torch.inference_mode():
        return ref(input_ids=ids, use_cache=False).logits


def test_demo_checkpoint_is_what_the_runtimes_expect(checkpoints: dict[str, Path]) -> None:
    single, sharded = checkpoints["single"], checkpoints["sharded"]
    cfg = json.loads((single / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["dtype"]) == (128, 2, 2048, "bfloat16")
    assert (single / "model.safetensors").is_file() and (single / "tokenizer.json").is_file()
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(read_weight_set(sharded).headers) > 1
    assert {e.dtype for h in read_weight_set(single).headers for e in h.tensors.values()} == {"BF16"}


def test_loads_serves_and_releases_a_checkpoint(checkpoints: dict[str, Path]) -> None:
    path = checkpoints["single"]
    rt = HFRuntime(spec(path, warmup=(TokenWarmup(8, 1), TokenWarmup(16, 2))))
    assert isinstance(rt, Runtime) and rt.endpoint is None
    need = rt.required_bytes()
    assert need == read_weight_set(path).data_bytes
    seen: list[tuple[int, int]] = []
    held = rt.load(progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1] == (need, need)
    # The weights plus the rotary frequencies computed on the device, nothing left on meta.
    assert need <= held < need + 4096
    assert rt.model is not None and all(t.device.type == "cpu" for t in rt.model.state_dict().values())

    figures = rt.warm()
    assert [(f["prompt_tokens"], f["batch"]) for f in figures] == [(8, 1), (16, 2)]
    assert all(f["passes"] >= 3 and f["latency_ms"] > 0 for f in figures)

    # The module prewarm assembled computes what transformers' own loading of the checkpoint computes.
    ids = torch.randint(0, 2048, (2, 12), generator=torch.Generator().manual_seed(3))
    assert torch.equal(rt._forward(ids), reference_logits(path, ids))

    text = rt.serve({"prompt": "Hello, world", "max_tokens": 5})
    assert text["usage"]["completion_tokens"] == 5 and isinstance(text["text"], str) and text["text"]
    fwd = rt.serve({"input_ids": [[1, 2, 3, 4]]})
    assert fwd["output"]["shape"] == [1, 4, 2048] and fwd["output"]["finite"]

    weight = weakref.ref(next(rt.model.parameters()))
    assert rt.release() == held
    gc.collect()
    assert rt.measure() == 0 and rt.model is None and weight() is None  # no tensor of it is left referenced
    assert rt.release() == 0  # idempotent


def test_sharded_checkpoint_loads_the_same_module(checkpoints: dict[str, Path]) -> None:
    one, many = HFRuntime(spec(checkpoints["single"])), HFRuntime(spec(checkpoints["sharded"]))
    assert one.required_bytes() == many.required_bytes()
    one.load(), many.load()
    ids = torch.arange(1, 17).unsqueeze(0)
    assert torch.equal(one._forward(ids), many._forward(ids))
    one.release(), many.release()


def test_checkpoint_without_config_fails_clearly(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    path = copy(checkpoints["single"], tmp_path)
    (path / "config.json").unlink()
    with pytest.raises(MissingConfig, match=r"has no config\.json") as err:
        HFRuntime(spec(path)).required_bytes()
    assert isinstance(err.value, LoadFailed) and "tiny-llama@v1 on node/cpu:0" in str(err.value)


@pytest.mark.parametrize("change, words", [
    ({"model_type": "no-such-model"}, "does not know the architecture"),
    ({"architectures": ["NoSuchForCausalLM"]}, "has no class 'NoSuchForCausalLM'"),
])
def test_unknown_architecture_fails_clearly(checkpoints: dict[str, Path], tmp_path: Path, change: dict,
                                            words: str) -> None:
    path = copy(checkpoints["single"], tmp_path)
    edit_config(path, **change)
    with pytest.raises(UnknownArchitecture, match=words):
        HFRuntime(spec(path)).required_bytes()


def test_weights_that_disagree_with_the_config_fail_before_loading(checkpoints: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    path = copy(checkpoints["single"], tmp_path)
    edit_config(path, intermediate_size=512)  # the MLP weights on disk are 256 wide
    rt = HFRuntime(spec(path))
    with pytest.raises(ShapeMismatch, match=r"mlp\.(gate|up|down)_proj\.weight.*the config gives bfloat16\[") as err:
        rt.required_bytes()
    assert "disagree with its config.json" in str(err.value)
    assert rt.model is None  # nothing was read


def test_dtype_that_disagrees_with_the_config_fails(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    path = copy(checkpoints["single"], tmp_path)
    edit_config(path, dtype="float32")
    with pytest.raises(ShapeMismatch, match=r"the config gives float32\[.*the weights hold bf16"):
        HFRuntime(spec(path)).required_bytes()


def test_a_cancelled_load_keeps_nothing(checkpoints: dict[str, Path]) -> None:
    rt = HFRuntime(spec(checkpoints["sharded"]))
    rt.required_bytes()

    def cancel() -> None:
        raise Cancelled("evicted while loading")

    with pytest.raises(Cancelled):
        rt.load(check_cancel=cancel)
    assert rt.model is None and rt.measure() == 0


def test_bad_requests_say_what_to_send(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    path = copy(checkpoints["single"], tmp_path)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (path / f).unlink()
    rt = HFRuntime(spec(path))
    rt.load()
    with pytest.raises(BadServeRequest, match="no tokenizer files"):
        rt.serve({"prompt": "hi"})
    with pytest.raises(BadServeRequest, match=r"token ids must be in \[0, 2048\)"):
        rt.serve({"input_ids": [[5000]]})
    with pytest.raises(BadServeRequest, match="prompt_tokens and batch"):
        rt.serve({"prompt_tokens": 0})
    assert rt.serve({"prompt_tokens": 4, "batch": 2})["output"]["shape"] == [2, 4, 2048]
    rt.release()


# --- the model roots, checked at load time -----------------------------------------------------------
def cataloged(src: Path, tmp_path: Path) -> ModelEntry:
    """A copy of `src` under tmp_path/models, read through a catalog (roots: its folder)."""
    models = tmp_path / "models"
    shutil.copytree(src, models / "ckpt")
    (models / "catalog.toml").write_text('[[models]]\nid = "tiny-llama"\nversion = "v1"\n'
                                         'runtime = "transformers"\npath = "ckpt"\n'
                                         '[[models.warmup]]\nprompt_tokens = 8\n')
    (tmp_path / "outside").mkdir()
    return load_catalog(models / "catalog.toml").get("tiny-llama", "v1")  # every weights file inside


def roots_spec(entry: ModelEntry) -> ReplicaSpec:
    """What the worker's lifecycle hands the runtime for a catalog entry."""
    return spec(entry.weights, roots=entry.roots)


def move_out(entry: ModelEntry, name: str) -> Path:
    """Move the checkpoint's file `name` out of the roots and leave a symlink to it in its place: the very
    same bytes, so only the roots check can refuse it. Returns the moved file."""
    inside = entry.weights / name
    outside = entry.weights.parent.parent / "outside" / name.replace("/", "_")
    shutil.move(inside, outside)
    inside.symlink_to(outside)
    return outside


def move_back(entry: ModelEntry, name: str, outside: Path) -> None:
    (entry.weights / name).unlink()
    shutil.move(outside, entry.weights / name)


def assert_refused(err: pytest.ExceptionInfo[CheckpointError], name: str, entry: ModelEntry) -> None:
    msg = str(err.value)
    assert isinstance(err.value, LoadFailed) and "tiny-llama@v1 on node/cpu:0" in msg
    assert f"{entry.weights / name}: resolves to" in msg and "outside the model roots" in msg
    assert str(entry.roots[0]) in msg


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                                  "tokenizer_config.json"])
def test_a_file_swapped_for_a_symlink_out_of_the_roots_after_the_catalog_was_read_is_refused(
        checkpoints: dict[str, Path], tmp_path: Path, name: str) -> None:
    entry = cataloged(checkpoints["single"], tmp_path)
    outside = move_out(entry, name)
    rt = HFRuntime(roots_spec(entry))
    with pytest.raises(CheckpointError, match="outside the model roots") as err:
        rt.load()
    assert_refused(err, name, entry)
    assert rt.model is None and rt.measure() == 0
    move_back(entry, name, outside)
    assert rt.load() > 0 and rt.release() > 0  # the same file inside the roots loads


def test_a_shard_or_the_index_of_a_sharded_checkpoint_swapped_out_of_the_roots_is_refused(
        checkpoints: dict[str, Path], tmp_path: Path) -> None:
    entry = cataloged(checkpoints["sharded"], tmp_path)
    for name in (sorted(p.name for p in entry.weights.glob("*.safetensors"))[-1], "model.safetensors.index.json"):
        outside = move_out(entry, name)
        with pytest.raises(CheckpointError) as err:
            HFRuntime(roots_spec(entry)).load()
        assert_refused(err, name, entry)
        move_back(entry, name, outside)


@pytest.mark.parametrize("name", ["tokenizer.json", "model.safetensors"])
def test_a_swap_between_sizing_and_loading_is_refused_and_nothing_is_kept(checkpoints: dict[str, Path],
                                                                          tmp_path: Path, name: str) -> None:
    entry = cataloged(checkpoints["single"], tmp_path)
    rt = HFRuntime(roots_spec(entry))
    rt.required_bytes()  # sized with every file inside; the worker reserves, then loads
    move_out(entry, name)  # the loader opens the weights, then transformers the tokenizer files
    with pytest.raises(CheckpointError) as err:
        rt.load()
    assert_refused(err, name, entry)
    assert rt.model is None and rt.tokenizer is None and rt.measure() == 0


def test_a_checkpoint_directory_swapped_for_a_symlink_out_of_the_roots_is_refused(checkpoints: dict[str, Path],
                                                                                  tmp_path: Path) -> None:
    entry = cataloged(checkpoints["single"], tmp_path)
    moved = shutil.move(entry.weights, tmp_path / "outside" / "ckpt")
    entry.weights.symlink_to(moved, target_is_directory=True)
    with pytest.raises(CheckpointError, match=r"ckpt: resolves to .*outside the model roots"):
        HFRuntime(roots_spec(entry)).load()
    HFRuntime(spec(entry.weights)).required_bytes()  # the same files, no roots given: no boundary


def test_a_warmup_entry_whose_activations_pass_the_device_budget_is_not_warmed(checkpoints: dict[str, Path]) -> None:
    from gpu_worker.device import CpuDevice
    from prewarm.config import DeviceSpec

    path = checkpoints["single"]
    need = read_weight_set(path).data_bytes
    # Room for the weights and 256 KiB: 64 tokens x 4 prompts of logits alone are 64 x 4 x 2048 x 2 = 1 MiB.
    dev = CpuDevice(DeviceSpec("cpu", need + 8192 + 256 * 1024), "node/cpu:0")
    rt = HFRuntime(spec(path, warmup=(TokenWarmup(8, 1), TokenWarmup(64, 4)), budget=dev))
    dev.reserve("tiny-llama@v1", rt.required_bytes())
    dev.commit_measured("tiny-llama@v1", rt.load())
    before = dev.inventory()
    small, big = rt.warm()
    assert small["passes"] >= 1 and "not_warmed" not in small  # the entry that fits is warmed
    msg = big["not_warmed"]
    assert big["passes"] == 0
    assert "tiny-llama@v1 on node/cpu:0: warmup entry #1 (64 tokens x 4): its first pass's activations passed" in msg
    assert "declare a smaller warmup input" in msg
    assert dev.inventory() == before  # the warmup's reservations are gone; the replica's bytes as committed
    rt.release()
