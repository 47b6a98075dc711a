"""Catalog validation names the entry and the field at fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from prewarm.catalog import CatalogError, load_catalog, parse_catalog
from tests.model_files import model_files, tiny_catalog


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

    from prewarm.cli import main

    model_files(cat, "tiny-lm")[0].write_bytes(b"junk")
    rc = main(["models", "list", "--json", "--catalog", str(cat)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert [m["id"] for m in out["models"]] == ["tiny-sharded"]
    assert "tiny-lm" in out["problems"]
