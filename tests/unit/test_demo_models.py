"""The demo models: real modules, seeded weights in safetensors, a catalog the worker can serve."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from gpu_worker import demo_models as dm
from prewarm.catalog import load_catalog
from prewarm.programs.cli import main
from prewarm.safetensors_header import read_weight_set

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def test_full_demo_set_spans_20mb_to_1gb_with_sharded_models() -> None:
    sizes = {f"{m.id}@{m.version}": dm.param_count(m) * DTYPE_BYTES[m.args.get("dtype", "float32")]
             for m in dm.FULL}
    assert len(sizes) >= 12
    assert 15e6 <= min(sizes.values()) <= 30e6
    assert 0.9e9 <= max(sizes.values()) <= 1.2e9
    assert sum(m.shards >= 2 for m in dm.FULL) >= 2
    assert {m.builder for m in dm.FULL} == {"build_lm", "build_mlp"}  # more than one family
    assert len({(m.id, m.version) for m in dm.FULL}) == len(dm.FULL)


def test_small_demo_writes_a_valid_catalog(tmp_path: Path) -> None:
    cat_path = dm.write_demo(tmp_path / "demo", small=True, vllm=False)
    cat = load_catalog(cat_path)
    torch_models = [m for m in cat.models if m.runtime == "torch"]
    assert [m.key for m in torch_models] == [f"{m.id}@{m.version}" for m in dm.SMALL]
    for m in torch_models:
        spec = next(d for d in dm.SMALL if d.id == m.id and d.version == m.version)
        assert m.size_bytes == dm.param_count(spec) * DTYPE_BYTES[spec.args.get("dtype", "float32")]
        assert m.shards == spec.shards
        assert m.warmup and m.builder.startswith("gpu_worker.demo_models:")
    sharded = cat.get("tiny-sharded3")
    assert sharded.weights.name == "model.safetensors.index.json"
    index = json.loads(sharded.weights.read_text())
    assert index["metadata"]["total_size"] == sharded.size_bytes
    assert sorted(set(index["weight_map"].values())) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    read_weight_set(sharded.weights)  # every indexed tensor is in its shard, none twice


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*.safetensors")):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def test_weights_are_seeded_and_an_up_to_date_folder_is_left_alone(tmp_path: Path) -> None:
    a = dm.write_demo(tmp_path / "a", small=True)
    b = dm.write_demo(tmp_path / "b", small=True)
    assert _digest(a.parent) == _digest(b.parent)
    # Two versions of one model differ (seeded per id@version).
    v1 = (a.parent / "tiny-lm-v1" / "model.safetensors").read_bytes()
    v2 = (a.parent / "tiny-lm-v2" / "model.safetensors").read_bytes()
    assert v1 != v2
    mtime = a.stat().st_mtime_ns
    assert dm.write_demo(tmp_path / "a", small=True) == a and a.stat().st_mtime_ns == mtime
    (a.parent / ".demo-spec").unlink()  # an interrupted run leaves no stamp: the next one rewrites
    dm.write_demo(tmp_path / "a", small=True)
    assert (a.parent / ".demo-spec").exists() and _digest(a.parent) == _digest(b.parent)


def test_modules_built_from_the_weights_run(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    cat = load_catalog(dm.write_demo(tmp_path / "d", small=True, vllm=False))
    for entry in (e for e in cat.models if e.runtime == "torch"):
        fn = getattr(dm, entry.builder.split(":")[1])
        with torch.device("meta"):
            module = fn(**entry.builder_args)
        state = {}
        for f in entry.files:
            state.update(load_file(str(f)))
        module.load_state_dict(state, strict=True, assign=True)
        w = entry.warmup[0]
        if w.dtype == "int64":
            x = torch.randint(0, w.high or 2, w.shape)
        else:
            x = torch.randn(w.shape)
        with torch.inference_mode():
            y = module(x)
        assert torch.isfinite(y.float()).all(), entry.key
        assert not any(True for _ in module.buffers()), "demo modules hold no buffers outside their weights"


def test_cli_models_demo(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main(["models", "demo", "--out", str(tmp_path / "cli"), "--small", "--quiet"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(tmp_path / "cli" / "catalog.toml")
    assert main(["models", "list", "--json", "--catalog", out]) == 0
    listed = json.loads(capsys.readouterr().out)["models"]
    assert {m["id"] for m in listed} >= {"tiny-lm", "tiny-sharded", "tiny-mlp"}
    assert next(m for m in listed if m["id"] == "tiny-sharded")["shards"] == 2
    runtimes = {m["id"]: m["runtime"] for m in listed}
    assert runtimes["tiny-lm"] == "torch" and runtimes["tiny-llama-hf"] == "transformers"


def test_demo_checkpoint_is_served_by_transformers_and_loads(tmp_path: Path) -> None:
    from gpu_worker.runtimes import ReplicaSpec, TokenWarmup
    from gpu_worker.runtimes.hf import HFRuntime
    from gpu_worker.runtimes.warmup import WarmupPolicy

    cat = load_catalog(dm.write_demo(tmp_path / "d", small=True, vllm=False))
    entry = cat.get("tiny-llama-hf")
    assert entry.runtime == "transformers"
    assert (entry.weights / "config.json").is_file() and (entry.weights / "tokenizer.json").is_file()
    assert entry.size_bytes == sum(f.stat().st_size for f in entry.files) - sum(
        8 + int.from_bytes(f.read_bytes()[:8], "little") for f in entry.files)  # data bytes: file minus header
    rt = HFRuntime(ReplicaSpec(model=entry.id, version=entry.version, path=entry.weights, gpu="t/cpu:0",
                               warmup=tuple(TokenWarmup(w.prompt_tokens, w.batch) for w in entry.warmup),
                               policy=WarmupPolicy(min_passes=2, max_passes=3, max_seconds=5.0)))
    try:
        assert rt.required_bytes() == entry.size_bytes
        assert rt.load() >= entry.size_bytes
        assert [f["prompt_tokens"] for f in rt.warm()] == [16, 64]
        answer = rt.serve({"prompt": "hello world", "max_tokens": 3})
        assert isinstance(answer.get("text"), str)
    finally:
        rt.release()


def test_vllm_demo_model_only_when_the_engine_is_installed(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    venv = tmp_path / "vllm-env"
    monkeypatch.setenv("PREWARM_VLLM_VENV", str(venv))
    logged: list[str] = []
    cat_path = dm.write_demo(tmp_path / "without", small=True, log=logged.append)
    assert "tiny-llama-vllm" not in {m.id for m in load_catalog(cat_path).models}
    assert dm.VLLM_MISSING in cat_path.read_text() and any("prewarm engines install vllm" in m for m in logged)

    # A finished engine install (its python and stamp, as scripts/install-vllm.sh leaves them).
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / ".prewarm-engine").write_text("ok\nvllm 0.32.0 (cpu)\n")
    cat_path = dm.write_demo(tmp_path / "without", small=True)  # the same folder: no longer up to date
    entry = load_catalog(cat_path).get("tiny-llama-vllm")
    assert entry.runtime == "vllm" and entry.kv_cache_bytes > 0
    assert (entry.weights / "config.json").is_file() and dm.VLLM_MISSING not in cat_path.read_text()
    # Its LoRA adapters come with it: PEFT's names and shapes for the demo Llama's attention projections.
    cat = load_catalog(cat_path)
    adapters = cat.adapters_of("tiny-llama-vllm")
    assert [a.id for a in adapters] == [a.id for a in dm.ADAPTERS] and len(adapters) == 3
    assert (entry.max_adapters, entry.max_cpu_adapters, entry.max_lora_rank) == (2, 4, 16)
    from prewarm.safetensors_header import read_header

    first = adapters[0]
    cfg = json.loads((first.weights / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == first.rank == 8
    assert set(cfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    tensors = read_header(first.weights / "adapter_model.safetensors").tensors
    layer = "base_model.model.model.layers.1.self_attn"
    assert tensors[f"{layer}.q_proj.lora_A.weight"].shape == (8, 128)
    assert tensors[f"{layer}.k_proj.lora_B.weight"].shape == (64, 8)  # 2 KV heads of 32
    assert tensors[f"{layer}.o_proj.lora_B.weight"].shape == (128, 8)
    assert len(tensors) == 2 * 4 * 2  # two layers, four projections, A and B
