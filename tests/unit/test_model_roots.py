"""prewarm.model_roots: a weights file is opened only when its real path lies inside the model roots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prewarm.model_roots import RefusedFile, open_inside

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
