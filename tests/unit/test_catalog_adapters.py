"""LoRA adapters in the catalog (issue 29, item 1): a vllm-adapter entry names its vllm base, its PEFT
directory and rank; each refusal names the entry and says what to fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from gpu_worker.demo_hf import tiny_llama_config
from gpu_worker.demo_lora import adapter_tensors, write_lora_adapter
from prewarm.catalog import load_catalog
from prewarm.catalog_entries import ADAPTER_RUNTIME, CatalogError

BASE = """
[[models]]
id = "base-llm"
version = "v1"
runtime = "vllm"
path = "base"
{base_extra}
[[models.warmup]]
prompt_tokens = 8
"""
ADAPTER = """
[[models]]
id = "{id}"
version = "v1"
runtime = "vllm-adapter"
base = "{base}"
path = "{path}"
rank = {rank}
"""


def _checkpoint(folder: Path) -> None:
    """A vllm base as the catalog reads it: config.json and safetensors weights (headers only are read)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(tiny_llama_config()))
    save_file({"model.embed_tokens.weight": np.zeros((16, 8), np.float32)}, str(folder / "model.safetensors"))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    _checkpoint(tmp_path / "base")
    write_lora_adapter(tmp_path / "lora-a", tiny_llama_config(), rank=8, seed=1)
    write_lora_adapter(tmp_path / "lora-big", tiny_llama_config(), rank=32, seed=2)
    return tmp_path


def _write(root: Path, base_extra: str = "", adapters: tuple[dict, ...] = ()) -> Path:
    text = BASE.format(base_extra=base_extra)
    for a in adapters:
        text += ADAPTER.format(**{"id": "lora-a", "base": "base-llm", "path": "lora-a", "rank": 8, **a})
    cat = root / "catalog.toml"
    cat.write_text(text)
    return cat


def test_an_adapter_entry_loads_with_its_base_and_size(root: Path) -> None:
    cat = load_catalog(_write(root, "max_adapters = 3\nmax_cpu_adapters = 6\nmax_lora_rank = 16", ({},)))
    a, base = cat.get("lora-a"), cat.get("base-llm")
    assert a.runtime == ADAPTER_RUNTIME and a.is_adapter and a.base == "base-llm" and a.rank == 8
    expected = sum(t.nbytes for t in adapter_tensors(tiny_llama_config(), 8, 1).values())
    assert a.size_bytes == expected and a.files == (root / "lora-a" / "adapter_model.safetensors",)
    assert (base.max_adapters, base.max_cpu_adapters, base.max_lora_rank) == (3, 6, 16)
    assert [m.id for m in cat.adapters_of("base-llm")] == ["lora-a"] and cat.adapters_of("lora-a") == []
    assert a.summary()["base"] == "base-llm" and base.summary()["max_adapters"] == 3


def test_a_vllm_base_has_default_lora_slots(root: Path) -> None:
    base = load_catalog(_write(root)).get("base-llm")
    assert (base.max_adapters, base.max_cpu_adapters, base.max_lora_rank) == (4, 4, 16)


@pytest.mark.parametrize(("base_extra", "adapter", "needle"), [
    ("", {"base": "nope"}, "model 'lora-a': base 'nope' is not a model in the catalog; add it or fix the id"),
    ("", {"base": "lora-a"}, "model 'lora-a': base names the adapter itself"),
    ("", {"rank": 32, "path": "lora-big"},
     "model 'lora-a': rank 32 is above its base 'base-llm''s max_lora_rank 16; raise the base's max_lora_rank"),
    ("", {"rank": 16}, "model 'lora-a': rank = 16 but adapter_config.json says r = 8; make them agree"),
    ("", {"rank": 0}, "model 'lora-a': rank must be an integer between 1 and 512, got 0"),
    ("", {"path": "missing"}, "model 'lora-a': path"),
    ("", {"path": "../outside"}, "lies outside the model roots"),
    ("max_lora_rank = 12", {}, "model 'base-llm': max_lora_rank must be one of 1, 8, 16, 32"),
    ("max_adapters = 4\nmax_cpu_adapters = 2", {}, "model 'base-llm': max_cpu_adapters (2) must be at least "
                                                    "max_adapters (4)"),
    ("max_adapters = 0", {}, "model 'base-llm': max_adapters must be an integer between 1 and 256, got 0"),
])
def test_bad_adapters_are_refused_by_name(root: Path, base_extra: str, adapter: dict, needle: str) -> None:
    cat = _write(root, base_extra, (adapter,))
    with pytest.raises(CatalogError) as info:
        load_catalog(cat)
    assert needle in str(info.value)


def test_an_adapter_of_a_non_vllm_base_is_refused(root: Path) -> None:
    cat = _write(root, adapters=({},))
    cat.write_text(cat.read_text().replace('runtime = "vllm"\n', 'runtime = "transformers"\n', 1))
    with pytest.raises(CatalogError, match="base 'base-llm' has runtime 'transformers'; an adapter is loaded into "
                                           "a vllm engine"):
        load_catalog(cat)


def test_lora_keys_belong_to_their_runtimes(root: Path) -> None:
    cat = _write(root, adapters=({},))
    cat.write_text(cat.read_text().replace('rank = 8\n', 'rank = 8\nkv_cache_bytes = 5\n'))
    with pytest.raises(CatalogError, match="key 'kv_cache_bytes' does not apply to runtime 'vllm-adapter'"):
        load_catalog(cat)


@pytest.mark.parametrize(("broken", "needle"), [
    ("adapter_model.safetensors", "adapter weights"),
    ("adapter_config.json", "is not valid JSON"),
])
def test_broken_adapter_files_are_refused(root: Path, broken: str, needle: str) -> None:
    (root / "lora-a" / broken).write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{not")
    with pytest.raises(CatalogError, match=f"model 'lora-a': .*{needle}"):
        load_catalog(_write(root, adapters=({},)))


def test_missing_adapter_weights_say_what_peft_writes(root: Path) -> None:
    (root / "lora-a" / "adapter_model.safetensors").unlink()
    with pytest.raises(CatalogError, match="adapter_model.safetensors does not exist; PEFT saves"):
        load_catalog(_write(root, adapters=({},)))


def test_adapter_files_symlinked_out_of_the_roots_are_refused(root: Path, tmp_path_factory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    write_lora_adapter(elsewhere, tiny_llama_config(), rank=8)
    (root / "lora-a" / "adapter_model.safetensors").unlink()
    (root / "lora-a" / "adapter_model.safetensors").symlink_to(elsewhere / "adapter_model.safetensors")
    with pytest.raises(CatalogError, match="model 'lora-a': .*outside the model roots"):
        load_catalog(_write(root, adapters=({},)))


def test_lenient_load_drops_the_adapter_alone_and_says_why(root: Path) -> None:
    cat = _write(root, adapters=({}, {"id": "lora-x", "base": "gone"}))
    loaded = load_catalog(cat, strict=False)
    assert loaded.ids() == ["base-llm", "lora-a"]
    assert "base 'gone' is not a model in the catalog" in loaded.problems["lora-x"]


def test_an_adapter_whose_base_was_refused_says_so(root: Path) -> None:
    (root / "base" / "model.safetensors").write_bytes(b"junk")
    loaded = load_catalog(_write(root, adapters=({},)), strict=False)
    assert loaded.ids() == []
    assert "(that entry was refused: " in loaded.problems["lora-a"]
