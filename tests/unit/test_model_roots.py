"""prewarm.model_roots: a weights file is opened only when its real path lies inside the model roots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prewarm.model_roots import RefusedFile, check_tree, open_inside

SECRET = b"root:x:0:0:root:/root:/bin/bash\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    return (tmp_path / "models").resolve()


def _read(fd: int) -> bytes:
    try:
        return os.pread(fd, 64, 0)
    finally:
        os.close(fd)


def test_a_file_inside_and_a_symlink_that_stays_inside_open(root: Path) -> None:
    (root / "blobs").mkdir()
    (root / "blobs" / "sha").write_bytes(b"weights")
    (root / "snap").mkdir()
    (root / "snap" / "model.safetensors").symlink_to("../blobs/sha")  # a Hugging Face cache's layout
    assert _read(open_inside(root / "blobs" / "sha", [root])) == b"weights"
    assert _read(open_inside(root / "snap" / "model.safetensors", [root])) == b"weights"


def test_a_symlink_leading_out_of_the_roots_is_refused_before_any_byte_is_read(root: Path, tmp_path: Path) -> None:
    secret = tmp_path / "passwd"
    secret.write_bytes(SECRET)
    (root / "model.safetensors").symlink_to(secret)
    with pytest.raises(RefusedFile, match="outside the model roots") as info:
        open_inside(root / "model.safetensors", [root])
    assert "root:x" not in str(info.value) and str(secret) in str(info.value)
    # a folder on the way that leads out is the same
    (root / "dir").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(RefusedFile, match="outside the model roots"):
        open_inside(root / "dir" / "passwd", [root])
    assert _read(open_inside(root / "model.safetensors", None)) == SECRET  # no roots given: no boundary


def test_only_regular_files_open(root: Path) -> None:
    fifo = root / "fifo.safetensors"
    os.mkfifo(fifo)  # opening a FIFO for reading would block until a writer came: refused at once
    with pytest.raises(RefusedFile, match="not a regular file"):
        open_inside(fifo, [root])
    (root / "d.safetensors").mkdir()
    with pytest.raises(RefusedFile, match="is a directory"):
        open_inside(root / "d.safetensors", [root])


def test_no_roots_means_nothing_is_inside(root: Path) -> None:
    (root / "m.safetensors").write_bytes(b"x")
    with pytest.raises(RefusedFile, match="outside the model roots"):
        open_inside(root / "m.safetensors", [])


def _checkpoint(root: Path) -> Path:
    ck = root / "ckpt"
    (ck / "sub").mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "model.safetensors", "sub/extra.json"):
        (ck / name).write_bytes(b"{}")
    return ck


def test_check_tree_passes_a_directory_whose_files_all_lie_inside(root: Path) -> None:
    ck = _checkpoint(root)
    (root / "blob").write_bytes(b"weights")
    (ck / "generation_config.json").symlink_to(root / "blob")  # a symlink that stays inside is fine
    assert [p.relative_to(ck).as_posix() for p in check_tree(ck, [root])] == \
        ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "sub/extra.json"]
    assert check_tree(ck, None) == []  # no roots given: no boundary


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors", "sub/extra.json"])
def test_check_tree_refuses_any_file_symlinked_out_of_the_roots_by_name(root: Path, tmp_path: Path,
                                                                       name: str) -> None:
    ck = _checkpoint(root)
    secret = tmp_path / "passwd"
    secret.write_bytes(SECRET)
    (ck / name).unlink()
    (ck / name).symlink_to(secret)
    with pytest.raises(RefusedFile, match="outside the model roots") as info:
        check_tree(ck, [root])
    assert str(ck / name) in str(info.value) and str(root) in str(info.value) and "root:x" not in str(info.value)


def test_check_tree_refuses_a_folder_symlinked_out_of_the_roots(root: Path, tmp_path: Path) -> None:
    ck = _checkpoint(root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_bytes(b"{}")
    (ck / "linked").symlink_to(outside, target_is_directory=True)  # a folder below the checkpoint
    with pytest.raises(RefusedFile, match=r"linked: resolves to .*outside the model roots"):
        check_tree(ck, [root])
    (root / "swapped").symlink_to(outside, target_is_directory=True)  # the checkpoint directory itself
    with pytest.raises(RefusedFile, match=r"swapped: resolves to .*outside the model roots"):
        check_tree(root / "swapped", [root])
    (ck / "linked").unlink()
    (ck / "loop").symlink_to(ck, target_is_directory=True)  # a loop inside: walked once, then done
    assert len(check_tree(ck, [root])) == 4


def test_check_tree_refuses_a_fifo_without_hanging(root: Path) -> None:
    ck = _checkpoint(root)
    os.mkfifo(ck / "tokenizer.model")
    with pytest.raises(RefusedFile, match="tokenizer.model: is not a regular file"):
        check_tree(ck, [root])
