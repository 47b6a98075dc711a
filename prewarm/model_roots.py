"""The model-roots boundary: weights are read only from files that really lie inside a catalog's roots.

The catalog names the folders weights may come from (`roots`). Checking that once, when the catalog is
read, is not enough: a shard can be swapped for a symlink to /etc/passwd afterwards, or an index can name
a shard through a symlink. So every weights file is checked *when it is opened* (`open_inside`):

- its real path (every symlink resolved) must lie inside a root: symlinks that stay inside (a Hugging
  Face cache's snapshot -> blob links) are fine, ones that lead out are refused;
- the real path is opened with O_NOFOLLOW, so a last component swapped for a symlink between the check
  and the open is refused too, and the path the kernel reports for the open file (/proc/self/fd) is
  checked again, which catches a folder on the way swapped in that window;
- only a regular file is accepted (O_NONBLOCK: a FIFO planted there cannot hang the open).

A checkpoint directory handed to a reader that opens files by name itself (transformers' config and
tokenizer loading, a vLLM engine) is checked with `check_tree` right before: every file below it passes
open_inside (opened and closed again), every folder on the way resolves inside the roots. That cannot
close the window between the check and that reader's own open; what prewarm reads itself (the weights,
config.json) goes through open_inside at the open.

Nothing here reads a byte of the file, so a refusal never echoes file content.
Importable without torch (web, scheduler and the catalog use it).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

__all__ = ["RefusedFile", "check_tree", "open_inside", "within"]


class RefusedFile(ValueError):
    """A weights file that must not be opened (outside the model roots, not a regular file)."""


def within(path: Path, roots: Sequence[Path]) -> bool:
    """`path` (already resolved) is one of `roots` or lies below one."""
    return any(path == r or r in path.parents for r in roots)


def _roots_text(roots: Sequence[Path]) -> str:
    return "[" + ", ".join(str(r) for r in roots) + "]"


def _real_inside(path: str | os.PathLike[str], roots: Sequence[Path]) -> str:
    """The real path of `path` (every symlink resolved), refused (RefusedFile) where it leads out of `roots`."""
    real = os.path.realpath(path)
    if not within(Path(real), roots):
        raise RefusedFile(f"{path}: resolves to {real}, outside the model roots {_roots_text(roots)}; "
                          "a model's files are read only from inside the catalog's roots")
    return real


def open_inside(path: str | os.PathLike[str], roots: Sequence[Path] | None) -> int:
    """Open `path` read-only and return the descriptor, refusing (RefusedFile) a file whose real path lies
    outside `roots` (resolved folders) or that is not a regular file. `roots=None`: no boundary (tools and
    tests reading a file they name themselves). FileNotFoundError and other OSErrors propagate."""
    if roots is None:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    real = _real_inside(path, roots)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # `real` had no symlink a moment ago: it was swapped for one
            raise RefusedFile(f"{path}: was replaced by a symlink while being opened; refused") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise RefusedFile(f"{path}: is {kind}, expected a regular file")
        try:
            opened = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # no /proc: the realpath check above stands alone
            opened = real
        if opened != real and not within(Path(opened), roots):
            raise RefusedFile(f"{path}: a folder on its path was swapped while it was opened (it opened "
                              f"{opened}, outside the model roots {_roots_text(roots)}); refused")
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_tree(folder: str | os.PathLike[str], roots: Sequence[Path] | None) -> list[Path]:
    """Every file below `folder` checked as open_inside checks it (opened and closed, no byte read), and
    `folder` and each folder below it (symlinked ones followed) resolved inside `roots`; returns the files
    checked. RefusedFile names the first that is not; a file that vanished meanwhile (a dangling symlink
    inside the roots) raises its OSError. `roots=None`: no boundary, nothing checked."""
    if roots is None:
        return []
    checked: list[Path] = []
    walked: set[str] = set()
    pending = [Path(folder)]
    while pending:
        d = pending.pop()
        real = _real_inside(d, roots)
        if real in walked:  # a symlink back up the tree: each folder is walked once
            continue
        walked.add(real)
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            if e.is_dir():  # a symlinked folder too: where it leads is checked when it is walked
                pending.append(Path(e.path))
            else:
                os.close(open_inside(e.path, roots))
                checked.append(Path(e.path))
    return checked
