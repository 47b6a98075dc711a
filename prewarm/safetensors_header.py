"""Read and validate safetensors headers without torch (and without reading tensor data).

A safetensors file is ``u64 little-endian N`` + ``N`` bytes of JSON + the data section. The JSON
maps tensor names to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to
the data section) plus an optional ``"__metadata__"`` string map.

Everything here is validated against the file's real size *before* any tensor byte is read, so a
loader that trusts a :class:`SafetensorsHeader` can never read past the end of a file, read two
tensors' bytes into one another, or allocate a tensor whose size does not match its bytes.

Public API:

- :func:`read_header` (path, roots=None) -> :class:`SafetensorsHeader`
- :func:`read_index` (``model.safetensors.index.json``, roots=None) -> ``{tensor name: shard path}``
- :func:`weight_files` (a ``.safetensors`` file, an index json, or a directory holding either)
  -> list of shard paths
- :func:`read_weight_set` (same inputs) -> :class:`WeightSet` with every shard's header, the index
  checked against the shards (each indexed tensor in its shard, no tensor in two shards)
- :class:`SafetensorsError` (a ``ValueError``): the message names the file, the tensor or field at
  fault, and what to do about it. It is the only error a malformed file or index raises: JSON nested past
  the parser's recursion limit, an integer past Python's int-string limit, an unreadable file all become one.

Bounds (a header or index is read whole, so these bound the time and memory one file can cost a reader):
a header or index of at most :data:`MAX_HEADER_BYTES`, a file of at most :data:`MAX_TENSORS_PER_FILE`
tensors, an index of at most :data:`MAX_TENSORS_PER_INDEX`, integers of at most :data:`MAX_INT_DIGITS` digits.

``roots``: the catalog's model roots. Given, every file (each shard, the index) is opened through
:func:`prewarm.model_roots.open_inside`: one whose real path leads outside them is refused before a byte
of it is read. Error messages never quote file bytes: a file that is not safetensors at all is called
that, without the number its first 8 bytes make (that number *is* those bytes, e.g. ``root:x:0``).
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prewarm.model_roots import RefusedFile, open_inside

__all__ = [
    "DTYPE_SIZES",
    "INDEX_FILENAME",
    "MAX_HEADER_BYTES",
    "MAX_INT_DIGITS",
    "MAX_TENSORS_PER_FILE",
    "MAX_TENSORS_PER_INDEX",
    "SafetensorsError",
    "SafetensorsHeader",
    "TensorEntry",
    "WeightSet",
    "read_header",
    "read_index",
    "read_weight_set",
    "weight_files",
]

# Bytes per element for every dtype name the safetensors format defines with whole-byte elements.
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}

# The reference implementation refuses headers above 100 MB; a bigger one is corruption, and
# refusing it early stops us from allocating a huge buffer because of one flipped length byte.
MAX_HEADER_BYTES = 100_000_000  # an index json is held to it too
# Tensors in one file. Real checkpoints' files hold a few thousand (a 70B model's shard, a whole 7B model
# in one file: ~300-3,000); a header of 900,000 one-byte tensors, within the 100 MB above, took 14 s and
# 670 MiB to parse. Parsing stops as soon as the header has more objects than this allows.
MAX_TENSORS_PER_FILE = 100_000
# Tensors one index lists (over all its shards): the largest mixture-of-experts checkpoints list on the
# order of 100,000.
MAX_TENSORS_PER_INDEX = 1_000_000
# Digits of one JSON integer: sizes and offsets are u64 (at most 20 digits). Python's own int-string limit
# (4,300 digits) would raise a plain ValueError; a longer number is refused here, by name.
MAX_INT_DIGITS = 20

INDEX_FILENAME = "model.safetensors.index.json"

_FIX_FILE = "re-export the weights (e.g. safetensors.torch.save_file) or re-download the file"
Roots = Sequence[Path] | None


class SafetensorsError(ValueError):
    """A safetensors file or index that cannot be loaded safely.

    ``path`` is the file at fault, ``where`` the tensor or field (``None`` for the file as a whole).
    """

    def __init__(self, path: str | os.PathLike[str], where: str | None, problem: str, fix: str = _FIX_FILE):
        self.path = Path(path)
        self.where = where
        self.problem = problem
        self.fix = fix
        place = f"{self.path}" + (f": {where}" if where else "")
        super().__init__(f"{place}: {problem}; {fix}" if fix else f"{place}: {problem}")


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor in a safetensors file; ``begin``/``end`` are relative to the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return 0 if 0 in self.shape else math.prod(self.shape)  # a zero first: no product of huge dims

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    """A validated header: every entry's bytes lie inside the file and no two entries overlap."""

    path: Path
    file_size: int
    data_offset: int  # absolute file offset of the data section (8 + header length)
    metadata: dict[str, str]
    tensors: dict[str, TensorEntry]  # in data-section order
    identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the file read: a reader reopening it checks it

    @property
    def data_bytes(self) -> int:
        """Bytes of tensor data (what a loaded model occupies, before any padding by the device)."""
        return sum(t.nbytes for t in self.tensors.values())

    def absolute(self, entry: TensorEntry) -> tuple[int, int]:
        """File offsets ``[start, stop)`` of an entry's bytes."""
        return self.data_offset + entry.begin, self.data_offset + entry.end


@dataclass(frozen=True, slots=True)
class WeightSet:
    """The validated headers of one model's weights (a single file or every shard of an index)."""

    source: Path
    headers: list[SafetensorsHeader]
    index: dict[str, Path] | None = field(default=None)

    @property
    def files(self) -> list[Path]:
        return [h.path for h in self.headers]

    @property
    def data_bytes(self) -> int:
        return sum(h.data_bytes for h in self.headers)

    @property
    def tensor_count(self) -> int:
        return sum(len(h.tensors) for h in self.headers)


def _is_int(value: object) -> bool:
    # bool is an int subclass in Python; `true` is not a valid offset or dimension.
    return isinstance(value, int) and not isinstance(value, bool)


def _header_objects(path: Path) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    """object_pairs_hook for a header: refuses a duplicate key, and stops the parse once the header holds
    more objects than MAX_TENSORS_PER_FILE tensors allow (one per tensor, the metadata, the header itself),
    before the rest of a huge header is turned into Python objects."""
    count = 0

    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        nonlocal count
        count += 1
        if count > MAX_TENSORS_PER_FILE + 2:
            raise _too_many_tensors(path, f"more than {MAX_TENSORS_PER_FILE:,}")
        out: dict[str, object] = {}
        for key, value in pairs:
            if key in out:
                raise SafetensorsError(path, f"tensor {key!r}", "appears twice in the header")
            out[key] = value
        return out

    return hook


def _too_many_tensors(path: Path, count: str) -> SafetensorsError:
    return SafetensorsError(
        path, "header", f"holds {count} tensors; prewarm reads at most {MAX_TENSORS_PER_FILE:,} per file "
        "(MAX_TENSORS_PER_FILE: real checkpoints hold a few thousand)",
        "save the weights in shards (safetensors index json) or merge small tensors")


def _bounded_int(path: Path, where: str | None, fix: str) -> Callable[[str], int]:
    """parse_int for json.loads: an integer of more than MAX_INT_DIGITS digits is refused by name (Python's
    int-string conversion limit would raise a plain ValueError past 4,300)."""
    def parse(digits: str) -> int:
        n = len(digits.lstrip("-"))
        if n > MAX_INT_DIGITS:
            raise SafetensorsError(path, where, f"holds an integer of {n:,} digits; sizes and offsets have at "
                                                f"most {MAX_INT_DIGITS}", fix)
        return int(digits)

    return parse


def _load_json(path: Path, text: str, where: str | None, fix: str,
               hook: Callable[[list[tuple[str, object]]], object] | None = None) -> object:
    """json.loads, with every way hostile text can make it fail (bad syntax, nesting past the recursion
    limit, a huge integer) raised as a SafetensorsError naming the file: one bad file must never surface
    as an error its callers do not expect (RecursionError, a plain ValueError)."""
    try:
        return json.loads(text, object_pairs_hook=hook, parse_int=_bounded_int(path, where, fix))
    except SafetensorsError:
        raise
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except RecursionError:
        problem = f"JSON nested too deeply to read (deeper than {sys.getrecursionlimit()} levels)"
    except ValueError as exc:  # what else json raises on its input; its message quotes none of it
        problem = f"not readable as JSON ({exc})"
    raise SafetensorsError(path, where, problem, fix) from None


def _parse_entry(path: Path, name: str, raw: object) -> TensorEntry:
    where = f"tensor {name!r}"
    if not isinstance(raw, dict):
        raise SafetensorsError(path, where, f"header entry is {type(raw).__name__}, expected an object")
    unknown = set(raw) - {"dtype", "shape", "data_offsets"}
    if unknown:
        raise SafetensorsError(path, where, f"unknown field(s) {sorted(unknown)} in the header entry")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in raw:
            raise SafetensorsError(path, f"{where} field {key!r}", "missing from the header entry")

    dtype = raw["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise SafetensorsError(
            path,
            f"{where} field 'dtype'",
            f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_SIZES)})",
            "convert the tensor to a supported dtype and re-export",
        )

    shape = raw["shape"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise SafetensorsError(
            path, f"{where} field 'shape'", f"shape {shape!r} is not a list of non-negative integers"
        )

    offsets = raw["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        raise SafetensorsError(
            path, f"{where} field 'data_offsets'", f"{offsets!r} is not a pair of integers [begin, end]"
        )
    begin, end = offsets
    if begin < 0 or end < begin:
        raise SafetensorsError(
            path, f"{where} field 'data_offsets'", f"[{begin}, {end}] is not a range with 0 <= begin <= end"
        )

    entry = TensorEntry(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)
    expected = _bytes_needed(entry.shape, entry.itemsize)
    if expected != entry.nbytes:
        needs = f"{expected} bytes" if expected is not None else "more than 2**64 bytes"
        raise SafetensorsError(
            path,
            where,
            f"shape {_shape_text(entry.shape)} x {dtype} ({entry.itemsize} B) needs {needs} "
            f"but data_offsets [{begin}, {end}] span {entry.nbytes}",
        )
    return entry


def _bytes_needed(shape: tuple[int, ...], itemsize: int) -> int | None:
    """dtype x shape in bytes, or None past 2**64 (no file is that big): a shape of many huge dimensions
    must not build a product of millions of digits (a header may hold a million dimensions)."""
    if 0 in shape:
        return 0
    n = itemsize
    for d in shape:
        n *= d
        if n > 1 << 64:
            return None
    return n


def _shape_text(shape: tuple[int, ...]) -> str:
    return str(list(shape)) if len(shape) <= 8 else f"[{', '.join(map(str, shape[:8]))}, ... ({len(shape)} dims)]"


def _open(p: Path, roots: Roots, what: str = "file") -> int:
    """open_inside, its refusals and any OSError opening it as SafetensorsError naming `p`."""
    try:
        return open_inside(p, roots)
    except RefusedFile as exc:
        raise SafetensorsError(p, None, str(exc).removeprefix(f"{p}: "), "") from None  # says what to do
    except FileNotFoundError:
        raise SafetensorsError(p, None, f"{what} not found", "check the path in the catalog or index") from None
    except IsADirectoryError:
        raise SafetensorsError(p, None, "is a directory, expected a .safetensors file", "") from None
    except OSError as exc:
        raise _unreadable(p, what, exc) from None


def _unreadable(p: Path, what: str, exc: OSError) -> SafetensorsError:
    return SafetensorsError(p, None, f"{what} cannot be read ({exc.strerror or exc})",
                            "check the file's permissions and the storage it lies on")


def read_header(path: str | os.PathLike[str], roots: Roots = None) -> SafetensorsHeader:
    """Read and validate the header of one safetensors file; reads no tensor data.

    Raises :class:`SafetensorsError` for anything that would make loading unsafe or wrong, and
    ``FileNotFoundError`` (re-raised as SafetensorsError) when the file is missing; with ``roots``, also
    for a file whose real path lies outside them (checked on open, before any byte is read).
    """
    p = Path(path)
    fd = _open(p, roots)
    try:
        st = os.fstat(fd)
        file_size = st.st_size
        if file_size < 8:
            raise SafetensorsError(
                p, "header length", f"file is {file_size} bytes, too short for the 8-byte header length"
            )
        try:
            prefix = os.pread(fd, 8, 0)
        except IsADirectoryError:
            raise SafetensorsError(p, None, "is a directory, expected a .safetensors file", "") from None
        except OSError as exc:
            raise _unreadable(p, "file", exc) from None
        (header_len,) = struct.unpack("<Q", prefix)
        # The length is the file's first 8 bytes: quoting it would quote the file (issue 17).
        if header_len == 0 or header_len > MAX_HEADER_BYTES:
            raise SafetensorsError(
                p,
                "header length",
                f"not a safetensors file (its header length is implausible: outside 1..{MAX_HEADER_BYTES} "
                "bytes), or its first bytes are corrupt",
            )
        if 8 + header_len > file_size:
            raise SafetensorsError(
                p,
                "header length",
                f"the declared header length runs past the end of the {file_size}-byte file "
                "(truncated, or not a safetensors file)",
            )
        try:
            raw = os.pread(fd, header_len, 8)
        except OSError as exc:
            raise _unreadable(p, "file", exc) from None
    finally:
        os.close(fd)
    if len(raw) != header_len:
        raise SafetensorsError(p, "header", f"short read: got {len(raw)} of {header_len} header bytes")
    return _parse_header(p, file_size, header_len, raw, (st.st_dev, st.st_ino))


def _parse_header(p: Path, file_size: int, header_len: int, raw: bytes,
                  identity: tuple[int, int] = (0, 0)) -> SafetensorsHeader:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsError(p, "header", f"not valid UTF-8 at byte {8 + exc.start}") from None
    doc = _load_json(p, text, "header", _FIX_FILE, _header_objects(p))
    if not isinstance(doc, dict):
        raise SafetensorsError(p, "header", f"JSON is {type(doc).__name__}, expected an object")

    metadata: dict[str, str] = {}
    meta = doc.pop("__metadata__", None)
    if meta is not None:
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            raise SafetensorsError(p, "field '__metadata__'", "must be an object of string to string")
        metadata = dict(meta)

    if len(doc) > MAX_TENSORS_PER_FILE:  # the hook stops most such headers early; this is the exact count
        raise _too_many_tensors(p, f"{len(doc):,}")
    entries = [_parse_entry(p, name, value) for name, value in doc.items()]

    data_offset = 8 + header_len
    data_size = file_size - data_offset
    # Past-EOF first: it is the most common corruption (a truncated copy) and the clearest message.
    for e in entries:
        if e.end > data_size:
            raise SafetensorsError(
                p,
                f"tensor {e.name!r}",
                f"data_offsets [{e.begin}, {e.end}] run past the end of the file: the data section holds "
                f"{data_size} bytes (file {file_size} B, header {header_len} B); the file is truncated",
            )

    # Sorted, contiguous coverage, as the reference writer produces and reader requires:
    # no overlap (two tensors aliasing bytes), no hole (bytes that belong to nothing).
    entries.sort(key=lambda e: (e.begin, e.end))
    cursor = 0
    previous: TensorEntry | None = None
    for e in entries:
        if e.begin < cursor:
            assert previous is not None
            raise SafetensorsError(
                p,
                f"tensor {e.name!r}",
                f"data_offsets [{e.begin}, {e.end}] overlap tensor {previous.name!r} "
                f"[{previous.begin}, {previous.end}]",
            )
        if e.begin > cursor:
            after = f"after tensor {previous.name!r}" if previous else "at the start of the data section"
            raise SafetensorsError(
                p,
                f"tensor {e.name!r}",
                f"data_offsets begin at {e.begin}, leaving a {e.begin - cursor}-byte hole {after}",
            )
        cursor = e.end
        previous = e
    if cursor != data_size:
        raise SafetensorsError(
            p,
            "data section",
            f"{data_size - cursor} bytes follow the last tensor's data (tensors cover {cursor} of "
            f"{data_size} data bytes): extra bytes were appended or the header is wrong",
        )

    return SafetensorsHeader(
        path=p,
        file_size=file_size,
        data_offset=data_offset,
        metadata=metadata,
        tensors={e.name: e for e in entries},
        identity=identity,
    )


def read_index(index_json_path: str | os.PathLike[str], roots: Roots = None) -> dict[str, Path]:
    """Read a Hugging Face ``model.safetensors.index.json``: ``{tensor name: shard path}``.

    Shard paths are resolved relative to the index's directory. Every referenced shard must exist;
    the error names the first missing one and the tensors that live in it. (Where a shard leads is
    checked when it is opened: read_header with the same roots.)
    """
    p = Path(index_json_path)
    text = _read_index_text(p, roots)
    doc = _load_json(p, text, None, "fix or regenerate the index")
    if not isinstance(doc, dict) or "weight_map" not in doc:
        raise SafetensorsError(p, "field 'weight_map'", "missing: not a safetensors index", "")
    wmap = doc["weight_map"]
    if not isinstance(wmap, dict) or not wmap:
        raise SafetensorsError(p, "field 'weight_map'", "must be a non-empty object of tensor name to shard file", "")
    if len(wmap) > MAX_TENSORS_PER_INDEX:
        raise SafetensorsError(p, "field 'weight_map'", f"lists {len(wmap):,} tensors; prewarm reads at most "
                                                        f"{MAX_TENSORS_PER_INDEX:,} per index (MAX_TENSORS_PER_INDEX)",
                               "regenerate the index")

    base = p.parent
    out: dict[str, Path] = {}
    missing: dict[str, list[str]] = {}
    present: dict[str, bool] = {}  # one stat per shard, not one per tensor
    for name, shard in wmap.items():
        if not isinstance(shard, str) or not shard:
            raise SafetensorsError(p, f"weight_map[{name!r}]", f"shard {shard!r} is not a file name", "")
        shard_path = Path(shard) if os.path.isabs(shard) else base / shard
        if shard not in present:
            present[shard] = shard_path.is_file()
        if not present[shard]:
            missing.setdefault(shard, []).append(name)
        out[name] = shard_path
    if missing:
        shard, names = next(iter(missing.items()))
        more = f" (and {len(missing) - 1} more missing shard(s))" if len(missing) > 1 else ""
        shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
        raise SafetensorsError(
            p,
            f"shard {shard!r}",
            f"missing shard file {base / shard} (holds {len(names)} tensor(s): {shown}){more}",
            "copy the missing shard next to the index or re-download the model",
        )
    return out


def _read_index_text(p: Path, roots: Roots) -> str:
    """The index's text, opened inside the roots; refused above MAX_HEADER_BYTES before it is read."""
    fd = _open(p, roots, "index file")
    try:
        size = os.fstat(fd).st_size
        if size > MAX_HEADER_BYTES:
            raise SafetensorsError(p, None, f"index is {size:,} bytes; prewarm reads at most {MAX_HEADER_BYTES:,} "
                                            "(MAX_HEADER_BYTES)", "fix or regenerate the index")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_HEADER_BYTES + 1).decode("utf-8")
    except UnicodeDecodeError:
        raise SafetensorsError(p, None, "index is not UTF-8 text", "") from None
    except OSError as exc:
        raise _unreadable(p, "index file", exc) from None
    finally:
        os.close(fd)


def _resolve(path: str | os.PathLike[str], roots: Roots) -> tuple[Path, dict[str, Path] | None]:
    """The weights source and, for a sharded set, its index."""
    p = Path(path)
    if p.is_dir():
        idx = p / INDEX_FILENAME
        if idx.is_file():
            return idx, read_index(idx, roots)
        singles = sorted(p.glob("*.safetensors"))
        if len(singles) == 1:
            return singles[0], None
        raise SafetensorsError(
            p,
            None,
            f"directory holds {len(singles)} .safetensors files and no {INDEX_FILENAME}",
            "point at one .safetensors file or at the index json",
        )
    if p.name.endswith(".json"):
        return p, read_index(p, roots)
    return p, None


def _unique(paths: Iterable[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


def weight_files(path: str | os.PathLike[str], roots: Roots = None) -> list[Path]:
    """The shard files of a model: ``[path]`` for one ``.safetensors`` file, the index's shards
    (in first-mention order) for an index json, or either found inside a directory."""
    source, index = _resolve(path, roots)
    if index is None:
        if not source.is_file():
            raise SafetensorsError(source, None, "file not found", "check the weights path in the catalog")
        return [source]
    return _unique(index.values())


def read_weight_set(path: str | os.PathLike[str], roots: Roots = None) -> WeightSet:
    """Validate every shard's header and, for a sharded set, the index against the shards."""
    source, index = _resolve(path, roots)
    if index is None:
        return WeightSet(source=source, headers=[read_header(source, roots)])
    headers = [read_header(f, roots) for f in _unique(index.values())]
    by_path = {h.path: h for h in headers}
    seen: dict[str, Path] = {}
    for h in headers:
        for name in h.tensors:
            if name in seen:
                raise SafetensorsError(
                    h.path, f"tensor {name!r}", f"also stored in shard {seen[name].name}: ambiguous", ""
                )
            seen[name] = h.path
    for name, shard in index.items():
        if name not in by_path[shard].tensors:
            raise SafetensorsError(
                shard,
                f"tensor {name!r}",
                f"listed in {source.name} but not in this shard",
                "regenerate the index or re-download the shard",
            )
    return WeightSet(source=source, headers=headers, index=index)
