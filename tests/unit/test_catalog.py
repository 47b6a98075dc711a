"""Catalog validation names the entry and the field at fault."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prewarm.catalog import load_catalog, parse_catalog
from prewarm.catalog_entries import CatalogError
from prewarm.safetensors_header import INDEX_FILENAME
from tests.model_files import HOSTILE, hostile_json, model_files, tiny_catalog, write_hostile_header

HOSTILE_PROBLEM = {"deeply-nested": "JSON nested too deeply", "huge-integer": "integer of 5,000 digits"}


@pytest.fixture
def cat(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "m", ["tiny-lm", "tiny-sharded"])


def _edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, count))


def test_demo_entries_load(cat: Path) -> None:
    c = load_catalog(cat)
    assert c.ids() == ["tiny-lm", "tiny-sharded"]
    assert c.get("tiny-sharded").shards == 2 and c.get("tiny-sharded").size_bytes > 0
    assert c.get("tiny-lm").builder_args["d_model"] == 64
    assert c.get("tiny-lm").warmup[0].high == 512


@pytest.mark.parametrize(("old", "new", "needle"), [
    ('version = "v1"', 'version = "v1"\nflavour = "x"', "model 'tiny-lm': unknown key 'flavour'"),
    ('builder = "gpu_worker.demo_models:build_lm"', 'builder = "gpu_worker.nope:build_lm"',
     "model 'tiny-lm': builder module 'gpu_worker.nope' cannot be found"),
    ('builder = "gpu_worker.demo_models:build_lm"', 'builder = "not an import path"',
     "model 'tiny-lm': builder 'not an import path' is not an import path"),
    ('weights = "tiny-lm-v1/model.safetensors"', 'weights = "tiny-lm-v1/missing.safetensors"',
     "model 'tiny-lm': weights file"),
    ('weights = "tiny-lm-v1/model.safetensors"', 'weights = "tiny-lm-v1/model.bin"',
     "must be .safetensors or .safetensors.index.json"),
    ('dtype = "int64"', 'dtype = "int4"', "model 'tiny-lm' warmup[0]: dtype 'int4'"),
    ('shape = [1, 16]', 'shape = [1, 0]', "model 'tiny-lm' warmup[0]: shape [1, 0]"),
])
def test_bad_entries_name_the_entry_and_field(cat: Path, old: str, new: str, needle: str) -> None:
    _edit(cat, old, new)
    with pytest.raises(CatalogError) as info:
        load_catalog(cat)
    assert needle in str(info.value) and str(cat) in str(info.value)


def test_duplicate_id_and_version(cat: Path) -> None:
    text = cat.read_text()
    first = text[: text.index("[[models]]", 1)]
    cat.write_text(text + "\n" + first)
    with pytest.raises(CatalogError, match="model 'tiny-lm': duplicate id"):
        load_catalog(cat)


def test_missing_shard_is_named(cat: Path) -> None:
    shard = model_files(cat, "tiny-sharded")[1]
    shard.unlink()
    with pytest.raises(CatalogError) as info:
        load_catalog(cat)
    msg = str(info.value)
    assert "model 'tiny-sharded'" in msg and "missing shard" in msg and shard.name in msg


def test_weights_outside_the_roots(tmp_path: Path) -> None:
    text = '[[models]]\nid = "x"\nversion = "v1"\nweights = "../elsewhere/model.safetensors"\n' \
           'builder = "gpu_worker.demo_models:build_lm"\n[[models.warmup]]\nshape = [1, 4]\ndtype = "int64"\n'
    with pytest.raises(CatalogError, match="lie outside the model roots"):
        parse_catalog(text, tmp_path / "catalog.toml")


def test_missing_catalog_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="prewarm models demo --out DIR"):
        load_catalog(tmp_path / "nope.toml")


def test_lenient_load_keeps_healthy_entries_and_names_the_broken_one(cat: Path) -> None:
    shard = model_files(cat, "tiny-sharded")[1]
    shard.write_bytes(b"\x00" * 3)  # corrupt: shorter than a safetensors header
    with pytest.raises(CatalogError):
        load_catalog(cat)  # strict: operators editing the file hear at once
    lenient = load_catalog(cat, strict=False)
    assert lenient.ids() == ["tiny-lm"]
    assert set(lenient.problems) == {"tiny-sharded"}
    assert shard.name in lenient.problems["tiny-sharded"]


def test_models_list_lists_healthy_entries_and_fails_naming_the_broken_one(cat: Path, capsys) -> None:
    import json

    from prewarm.programs.cli import main

    model_files(cat, "tiny-lm")[0].write_bytes(b"junk")
    rc = main(["models", "list", "--json", "--catalog", str(cat)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert [m["id"] for m in out["models"]] == ["tiny-sharded"]
    assert "tiny-lm" in out["problems"]


def _only_this_entry_refused(cat: Path, model: str, bad_file: Path, problem: str) -> None:
    """The strict load refuses the catalog naming the entry and file; the lenient one serves the others."""
    with pytest.raises(CatalogError, match=f"model '{model}'") as info:
        load_catalog(cat)
    assert str(bad_file) in str(info.value) and problem in str(info.value)
    lenient = load_catalog(cat, strict=False)
    assert model not in lenient.ids() and lenient.ids() == [m for m in ("tiny-lm", "tiny-sharded") if m != model]
    assert set(lenient.problems) == {model}
    assert str(bad_file) in lenient.problems[model] and problem in lenient.problems[model]


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_header_is_that_entrys_named_error_and_the_others_load(cat: Path, kind: str) -> None:
    # Before: RecursionError / ValueError out of load_catalog, so no entry of the catalog was served.
    weights = model_files(cat, "tiny-lm")[0]
    write_hostile_header(weights, kind)
    _only_this_entry_refused(cat, "tiny-lm", weights, HOSTILE_PROBLEM[kind])


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_index_is_that_entrys_named_error_and_the_others_load(cat: Path, kind: str) -> None:
    index = cat.parent / "tiny-sharded-v1" / INDEX_FILENAME
    index.write_bytes(hostile_json(kind).replace(b'{"w":', b'{"weight_map":', 1))
    _only_this_entry_refused(cat, "tiny-sharded", index, HOSTILE_PROBLEM[kind])


def test_an_unexpected_error_in_one_entry_is_named_with_its_type_and_the_others_load(
        cat: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # A builder whose package raises on import: find_spec lets that through (not an ImportError), an error
    # no check of the entry names. It is still only that entry's problem, with its type and a logged traceback.
    pkg = tmp_path / "pkgs" / "boom_builders"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ZeroDivisionError('the builder package is broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    _edit(cat, 'builder = "gpu_worker.demo_models:build_lm"', 'builder = "boom_builders.lm:build"')
    lenient = load_catalog(cat, strict=False)
    assert lenient.ids() == ["tiny-sharded"]
    assert lenient.problems["tiny-lm"].startswith("model 'tiny-lm': unexpected ZeroDivisionError while reading "
                                                  "the entry: the builder package is broken")
    assert any(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in caplog.records)
    with pytest.raises(CatalogError, match="model 'tiny-lm': unexpected ZeroDivisionError"):
        load_catalog(cat)


@pytest.mark.parametrize("kind", HOSTILE)
def test_models_list_prints_a_hostile_entrys_error_not_a_traceback(cat: Path, kind: str, capsys) -> None:
    from prewarm.programs.cli import main

    weights = model_files(cat, "tiny-lm")[0]
    write_hostile_header(weights, kind)
    rc = main(["models", "list", "--catalog", str(cat)])  # before: the RecursionError / ValueError escaped
    out, err = capsys.readouterr()
    assert rc == 1
    assert "tiny-sharded" in out and "tiny-lm " not in out
    assert f"model 'tiny-lm': weights: {weights}: header: " in err and HOSTILE_PROBLEM[kind] in err
    assert "Traceback" not in err


# --- runtimes ---------------------------------------------------------------------------------------
def _checkpoint_catalog(tmp_path: Path, body: str) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    ck = tmp_path / "ck"
    ck.mkdir(parents=True, exist_ok=True)
    save_file({"w": np.zeros((256,), dtype=np.float32)}, str(ck / "model.safetensors"))  # 1,024 data bytes
    path = tmp_path / "catalog.toml"
    path.write_text('[[models]]\nid = "chat"\nversion = "v1"\n' + body)
    return path


def test_a_checkpoint_runtime_entry_has_its_path_size_and_token_warmup(tmp_path: Path) -> None:
    warm = "[[models.warmup]]\nprompt_tokens = 32\nbatch = 2\n"
    hf = load_catalog(_checkpoint_catalog(tmp_path, 'runtime = "transformers"\npath = "ck"\n' + warm)).get("chat")
    assert (hf.runtime, hf.weights, hf.size_bytes, hf.kv_cache_bytes) == ("transformers", tmp_path / "ck", 1024, 0)
    assert hf.summary()["warmup"] == [{"prompt_tokens": 32, "batch": 2}] and hf.summary()["runtime"] == "transformers"
    # vllm: the KV cache and the engine's own processes (defaults in prewarm.engines) are part of what a
    # replica needs.
    from prewarm.engines import DEFAULT_KV_CACHE_BYTES, DEFAULT_VLLM_ENGINE_BYTES

    vl = load_catalog(_checkpoint_catalog(tmp_path, 'runtime = "vllm"\npath = "ck"\n' + warm)).get("chat")
    assert (vl.kv_cache_bytes, vl.size_bytes) == (DEFAULT_KV_CACHE_BYTES,
                                                  1024 + DEFAULT_KV_CACHE_BYTES + DEFAULT_VLLM_ENGINE_BYTES)
    vl = load_catalog(_checkpoint_catalog(tmp_path, 'runtime = "vllm"\npath = "ck"\nkv_cache_bytes = 4096\nengine_bytes = 0\n' + warm)).get("chat")
    assert (vl.kv_cache_bytes, vl.size_bytes) == (4096, 1024 + 4096)


def test_a_torch_entry_defaults_to_the_torch_runtime(cat: Path) -> None:
    assert {m.runtime for m in load_catalog(cat).models} == {"torch"}


@pytest.mark.parametrize(("body", "needle"), [
    ('runtime = "onnx"\npath = "ck"\n', "model 'chat': runtime 'onnx' is not one of torch, transformers, vllm"),
    ('runtime = "transformers"\n', "model 'chat': runtime 'transformers' needs path"),
    ('runtime = "transformers"\npath = "ck"\nkv_cache_bytes = 5\n', "key 'kv_cache_bytes' does not apply to runtime 'transformers'"),
    ('runtime = "vllm"\npath = "ck"\nbuilder = "json:loads"\n', "key 'builder' does not apply to runtime 'vllm'"),
    ('runtime = "vllm"\npath = "ck"\nkv_cache_bytes = -1\n', "kv_cache_bytes must be an integer between 1 and 17,592,186,044,416 (bytes, up to 16 TiB), got -1"),
    ('runtime = "vllm"\npath = "ck"\nengine_bytes = -1\n', "engine_bytes must be an integer between 0 and 17,592,186,044,416 (bytes, up to 16 TiB), got -1"),
    ('runtime = "vllm"\npath = "missing"\n', "is not a directory"),
])
def test_bad_runtime_fields_name_the_entry_and_what_is_allowed(tmp_path: Path, body: str, needle: str) -> None:
    path = _checkpoint_catalog(tmp_path, body + "[[models.warmup]]\nprompt_tokens = 8\n")
    with pytest.raises(CatalogError, match=re.escape(needle)):
        load_catalog(path)


def test_token_warmup_entries_are_validated(tmp_path: Path) -> None:
    path = _checkpoint_catalog(tmp_path, 'runtime = "transformers"\npath = "ck"\n[[models.warmup]]\nshape = [1, 4]\n')
    with pytest.raises(CatalogError, match="warmup.0.: unknown key 'shape'; a checkpoint runtime's warmup takes batch, prompt_tokens"):
        load_catalog(path)
    path = _checkpoint_catalog(tmp_path, 'runtime = "transformers"\npath = "ck"\n[[models.warmup]]\nprompt_tokens = 0\n')
    with pytest.raises(CatalogError, match="prompt_tokens must be an integer between 1 and 65,536, got 0"):
        load_catalog(path)


# --- warmup bounds (issue 24, 2.6): a warmup input the size of a request, named with its bound -------------
@pytest.mark.parametrize(("old", "new", "needle"), [
    ('shape = [1, 16]', 'shape = [1000000, 64]',
     "model 'tiny-lm' warmup[0]: shape [1000000, 64] has 64,000,000 elements; at most 4,194,304 "
     "(MAX_INPUT_ELEMENTS) are allowed per input"),
    ('shape = [1, 16]', 'shape = [1, 1, 1, 1, 1, 1, 1, 1, 16]',
     "model 'tiny-lm' warmup[0]: shape [1, 1, 1, 1, 1, 1, 1, 1, 16] has 9 dims; at most 8 (MAX_INPUT_DIMS)"),
])
def test_a_huge_warmup_shape_refuses_that_entry_naming_the_field_and_the_bound(cat: Path, old: str, new: str,
                                                                               needle: str) -> None:
    _edit(cat, old, new)
    with pytest.raises(CatalogError) as info:
        load_catalog(cat)  # strict: the whole file, for an operator editing it
    assert needle in str(info.value)
    lenient = load_catalog(cat, strict=False)  # the worker's read: that entry refused, the rest served
    assert lenient.ids() == ["tiny-sharded"] and set(lenient.problems) == {"tiny-lm"}
    assert needle in lenient.problems["tiny-lm"]


def test_the_largest_allowed_warmup_shape_loads(cat: Path) -> None:
    from prewarm.catalog_bounds import MAX_INPUT_ELEMENTS

    _edit(cat, "shape = [1, 16]", f"shape = [{MAX_INPUT_ELEMENTS // 64}, 64]")
    assert load_catalog(cat).get("tiny-lm").warmup[0].shape == (MAX_INPUT_ELEMENTS // 64, 64)


def test_too_many_warmup_inputs_refuse_the_entry(cat: Path) -> None:
    text = cat.read_text()
    first = text[: text.index("[[models]]", 1)]
    one = '[[models.warmup]]\nshape = [1, 8]\ndtype = "int64"\n'
    cat.write_text(first.rstrip("\n") + "\n" + one * 16 + text[len(first):])
    with pytest.raises(CatalogError, match=r"model 'tiny-lm': warmup has 18 entries; at most 16"):
        load_catalog(cat)


def test_a_huge_token_warmup_refuses_the_entry_naming_the_fields_and_the_bound(tmp_path: Path) -> None:
    path = _checkpoint_catalog(tmp_path, 'runtime = "transformers"\npath = "ck"\n[[models.warmup]]\n'
                                         'prompt_tokens = 65536\nbatch = 2\n')
    lenient = load_catalog(path, strict=False)
    assert lenient.ids() == []
    assert "model 'chat' warmup[0]: prompt_tokens x batch = 65536 x 2 = 131,072 tokens; at most 65,536 " \
           "(MAX_INPUT_TOKENS) are allowed per input" in lenient.problems["chat"]
