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

Nothing here reads a byte of the file, so a refusal never echoes file content.
Importable without torch (web, scheduler and the catalog use it).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

__all__ = ["RefusedFile", "open_inside", "within"]


class RefusedFile(ValueError):
    """A weights file that must not be opened (outside the model roots, not a regular file)."""


def within(path: Path, roots: Sequence[Path]) -> bool:
    """`path` (already resolved) is one of `roots` or lies below one."""
    return any(path == r or r in path.parents for r in roots)


def _roots_text(roots: Sequence[Path]) -> str:
    return "[" + ", ".join(str(r) for r in roots) + "]"


def open_inside(path: str | os.PathLike[str], roots: Sequence[Path] | None) -> int:
    """Open `path` read-only and return the descriptor, refusing (RefusedFile) a file whose real path lies
    outside `roots` (resolved folders) or that is not a regular file. `roots=None`: no boundary (tools and
    tests reading a file they name themselves). FileNotFoundError and other OSErrors propagate."""
    if roots is None:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    real = os.path.realpath(path)
    if not within(Path(real), roots):
        raise RefusedFile(f"{path}: resolves to {real}, outside the model roots {_roots_text(roots)}; "
                          "weights are read only from inside the catalog's roots")
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
            raise RefusedFile(f"{path}: is {kind}, expected a weights file")
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
