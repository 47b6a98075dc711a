"""Every numeric catalog field is finite and within its stated range (issue 24, finding 2.5): TOML reads
`nan` and `inf` as floats, and `max_rate_per_replica = nan` once passed validation and made every tick's
plan raise. A value out of range is that entry's error, naming the field, the range and the value; a
lenient load (the running system's) serves the other entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prewarm.catalog import load_catalog
from prewarm.catalog_entries import CatalogError
from tests.model_files import tiny_catalog

RATE = "max_rate_per_replica must be a finite number between 0.001 and 1,000,000 (requests/s), got "


@pytest.fixture
def cat(tmp_path: Path) -> Path:
    return tiny_catalog(tmp_path / "m", ["tiny-lm", "tiny-sharded"])


def _edit(path: Path, old: str, new: str) -> None:
    """Replace the first `old` (in the first entry, tiny-lm) with `new`."""
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def _add(path: Path, lines: str) -> None:
    _edit(path, 'version = "v1"', f'version = "v1"\n{lines}')


@pytest.mark.parametrize(("raw", "shown"), [
    ("nan", "nan"), ("inf", "inf"), ("-inf", "-inf"), ("5e-324", "5e-324"), ("-3.0", "-3.0"), ("0", "0"),
    ("0.0009", "0.0009"), ("1000001", "1000001"), ("99999999999999999999999", "99999999999999999999999"),
    ("true", "True"), ('"50"', "'50'"),
])
def test_a_bad_rate_cap_is_that_entrys_error(cat: Path, raw: str, shown: str) -> None:
    _add(cat, f"max_rate_per_replica = {raw}")
    with pytest.raises(CatalogError) as info:
        load_catalog(cat)
    assert f"model 'tiny-lm': {RATE}{shown}" in str(info.value)
    lenient = load_catalog(cat, strict=False)  # the running system's load: the other entries are served
    assert lenient.ids() == ["tiny-sharded"]
    assert f"{RATE}{shown}" in lenient.problems["tiny-lm"]


@pytest.mark.parametrize(("raw", "value"), [("0.001", 0.001), ("1000000", 1e6), ("50", 50.0), ("2.5", 2.5)])
def test_rate_caps_in_range_load(cat: Path, raw: str, value: float) -> None:
    _add(cat, f"max_rate_per_replica = {raw}")
    assert load_catalog(cat).get("tiny-lm").max_rate_per_replica == value


@pytest.mark.parametrize(("lines", "needle"), [
    ("min_replicas = 65", "min_replicas must be an integer between 0 and 64, got 65"),
    ("min_replicas = -1", "min_replicas must be an integer between 0 and 64, got -1"),
    ("min_replicas = nan", "min_replicas must be an integer between 0 and 64, got nan"),
    ("min_replicas = 2.0", "min_replicas must be an integer between 0 and 64, got 2.0"),
    ("max_replica_age = 99999999999", "max_replica_age must be a duration between 1 s and 365 days, got 99999999999"),
    (f'max_replica_age = "{"9" * 400}"', "max_replica_age must be a duration between 1 s and 365 days"),  # inf
    ("max_replica_age = nan", "max_replica_age nan must be a duration"),
    ("max_replica_age = inf", "max_replica_age inf must be a duration"),
])
def test_other_common_numbers(cat: Path, lines: str, needle: str) -> None:
    _add(cat, lines)
    with pytest.raises(CatalogError) as info:
        load_catalog(cat)
    assert f"model 'tiny-lm': {needle}" in str(info.value)
    assert load_catalog(cat, strict=False).ids() == ["tiny-sharded"]


@pytest.mark.parametrize(("old", "new", "needle"), [
    ("high = 512", "high = 4294967296", "warmup[0]: high must be an integer between 1 and 2,147,483,648, got 4294967296"),
    ("high = 512", "high = nan", "warmup[0]: high must be an integer between 1 and 2,147,483,648, got nan"),
    ("shape = [1, 16]", "shape = [1, 8388608]", "warmup[0]: shape [1, 8388608] must be a non-empty list of "
                                                "integers, each between 1 and 4,194,304"),
    ("shape = [1, 16]", "shape = [1, 1, 1, 1, 1, 1, 1, 1, 1]", "warmup[0]: shape [1, 1, 1, 1, 1, 1, 1, 1, 1] has 9 dims; at most 8"),
    ("shape = [1, 16]", "shape = [65536, 65536]", "warmup[0]: shape [65536, 65536] has 4,294,967,296 elements; "
                                                  "at most 4,194,304"),
    ("shape = [1, 16]", "shape = [1.5, 16]", "warmup[0]: shape [1.5, 16] must be a non-empty list of integers"),
])
def test_warmup_numbers(cat: Path, old: str, new: str, needle: str) -> None:
    _edit(cat, old, new)
    with pytest.raises(CatalogError) as info:
        load_catalog(cat)
    assert f"model 'tiny-lm' {needle}" in str(info.value)
    assert load_catalog(cat, strict=False).ids() == ["tiny-sharded"]


def test_too_many_warmup_entries(cat: Path) -> None:
    text = cat.read_text()
    first = text.index("[[models.warmup]]")
    entry = text[first: text.index("[[models.warmup]]", first + 1)]  # tiny-lm's first warmup table
    cat.write_text(text.replace(entry, entry * 16, 1))  # with its second one: 17
    with pytest.raises(CatalogError, match="model 'tiny-lm': warmup has 17 entries; at most 16"):
        load_catalog(cat)
    cat.write_text(text.replace(entry, entry * 15, 1))  # 16: the most
    assert len(load_catalog(cat).get("tiny-lm").warmup) == 16


def _checkpoint_catalog(tmp_path: Path, fields: str, warmup: str = "prompt_tokens = 8\n") -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    ck = tmp_path / "ck"
    ck.mkdir(parents=True, exist_ok=True)
    save_file({"w": np.zeros((256,), dtype=np.float32)}, str(ck / "model.safetensors"))
    path = tmp_path / "catalog.toml"
    path.write_text(f'[[models]]\nid = "chat"\nversion = "v1"\nruntime = "vllm"\npath = "ck"\n{fields}'
                    f"[[models.warmup]]\n{warmup}")
    return path


@pytest.mark.parametrize(("fields", "warmup", "needle"), [
    ("kv_cache_bytes = 1125899906842624\n", "prompt_tokens = 8\n",
     "kv_cache_bytes must be an integer between 1 and 17,592,186,044,416 (bytes, up to 16 TiB), got 1125899906842624"),
    ("kv_cache_bytes = 1e9\n", "prompt_tokens = 8\n", "kv_cache_bytes must be an integer between 1 and"),
    ("engine_bytes = inf\n", "prompt_tokens = 8\n", "engine_bytes must be an integer between 0 and"),
    ("", "prompt_tokens = nan\n", "warmup[0]: prompt_tokens must be an integer between 1 and 65,536, got nan"),
    ("", "prompt_tokens = 2097152\n", "warmup[0]: prompt_tokens must be an integer between 1 and 65,536, got 2097152"),
    ("", "prompt_tokens = 8\nbatch = 5000\n", "warmup[0]: batch must be an integer between 1 and 4,096, got 5000"),
])
def test_checkpoint_numbers(tmp_path: Path, fields: str, warmup: str, needle: str) -> None:
    with pytest.raises(CatalogError) as info:
        load_catalog(_checkpoint_catalog(tmp_path, fields, warmup))
    assert f"model 'chat'{'' if needle.startswith('warmup') else ':'} {needle}" in str(info.value)


def _strict_json(text: str) -> dict:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_models_list_json_is_json_with_a_non_finite_entry(cat: Path, capsys) -> None:
    from prewarm.programs.cli import main

    _add(cat, "max_rate_per_replica = nan")
    rc = main(["models", "list", "--json", "--catalog", str(cat)])
    out = _strict_json(capsys.readouterr().out)
    assert rc == 1
    assert [m["id"] for m in out["models"]] == ["tiny-sharded"]
    assert RATE + "nan" in out["problems"]["tiny-lm"]
