"""One parse of a GGUF file per load. ``gguf.GGUFReader`` maps the file and walks every field and tensor
header, which takes seconds on a real checkpoint; our loader, transformers' config helper and its tokenizer
helper would each parse it again. ``read_gguf`` caches the parsed reader per (file, size, mtime), and
``shared_reader`` hands that reader to transformers' helpers, which construct ``gguf.GGUFReader`` by name
inside their functions, for the duration of one call."""
from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from mindie_service.errors import ValidationError

_PATCH_LOCK = threading.Lock()


def read_gguf(path: Path) -> Any:
    """The parsed reader of ``path`` (a ValidationError naming the file when it is not a readable GGUF)."""
    st = path.stat()
    return _cached(str(path.resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=2)
def _cached(file: str, size: int, mtime_ns: int) -> Any:
    return parse_gguf(Path(file))


class ArrayParts(Sequence):
    """An array field's ``parts`` as gguf.GGUFReader lists them (key length, key, value type, item type, count, then
    each item's: a string's length and bytes, a scalar's one-element view), each view made when it is read. The stock
    reader makes them all at the parse: ~250k numpy objects for SmolLM2's vocabulary and merges, whose arenas the
    objects that a load keeps, made while the parse lives, pin in the RSS after it is dropped (issue 44)."""

    def __init__(self, reader: Any, head: list[Any], starts: np.ndarray, lengths: np.ndarray | None,
                 item: Any) -> None:
        self._reader, self._head, self._starts, self._lengths, self._item = reader, head, starts, lengths, item
        self._per = 1 if lengths is None else 2

    def __len__(self) -> int:
        return len(self._head) + self._per * len(self._starts)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        k = k + len(self) if k < 0 else k
        if not 0 <= k < len(self):
            raise IndexError(k)
        if k < len(self._head):
            return self._head[k]
        i, j = divmod(k - len(self._head), self._per)
        start = int(self._starts[i])
        if self._lengths is None:
            return self._reader._get(start, self._item)
        if j == 0:
            return self._reader._get(start, np.uint64)
        return self._reader._get(start + 8, np.uint8, int(self._lengths[i]))


def strings(field: Any) -> list[str]:
    """A string array field's items (``field.contents()``), decoded straight from the mapped file where its parts are
    compact: no numpy view per item, whose allocations would be scattered among the strings a caller keeps."""
    parts = field.parts
    if not isinstance(parts, ArrayParts) or parts._lengths is None:
        return field.contents()
    data = memoryview(parts._reader.data)
    return [str(data[s + 8:s + 8 + n], "utf-8") for s, n in zip(parts._starts.tolist(), parts._lengths.tolist())]


def numbers(field: Any) -> list[Any]:
    """A number array field's items (``field.contents()``), read in one view where its parts are compact."""
    parts = field.parts
    if not isinstance(parts, ArrayParts) or parts._lengths is not None or not len(parts._starts):
        return field.contents()
    return parts._reader._get(int(parts._starts[0]), parts._item, len(parts._starts)).tolist()


def _array_field(reader: Any, offs: int, head: list[Any]) -> tuple[int, Any, Any, list[Any]] | None:
    """(size, parts, data indices, types) of the array value at ``offs``, compact (ArrayParts); None for an array
    of arrays, which the stock reader walks."""
    from gguf import GGUFValueType
    itype, alen = reader._get(offs, np.uint32), reader._get(offs + 4, np.uint64)
    item, n, pos = GGUFValueType(int(itype[0])), int(alen[0]), offs + 12
    head = head + [itype, alen]
    types = [GGUFValueType.ARRAY, item] if n else [GGUFValueType.ARRAY]  # the stock reader's: items name the type
    if item == GGUFValueType.STRING:
        starts, lengths = np.empty(n, np.int64), np.empty(n, np.int64)
        raw, order = reader.data, "big" if (reader.byte_order == "S") == (sys.byteorder == "little") else "little"
        for i in range(n):  # each length says where the next string starts
            starts[i], lengths[i] = pos, int.from_bytes(raw[pos:pos + 8].tobytes(), order)
            pos += 8 + int(lengths[i])
        parts = ArrayParts(reader, head, starts, lengths, None)
        return pos - offs, parts, range(len(head) + 1, len(parts), 2), types
    nptype = reader.gguf_scalar_to_np.get(item)
    if nptype is None:
        return None
    size = np.dtype(nptype).itemsize
    parts = ArrayParts(reader, head, pos + size * np.arange(n, dtype=np.int64), None, nptype)
    return 12 + size * n, parts, range(len(head), len(parts)), types


def _named_reader() -> Any:
    """gguf.GGUFReader whose tensor of an unknown type fails naming the tensor and the type's number, and whose array
    fields are compact (ArrayParts)."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
    from gguf.gguf_reader import ReaderField

    class NamedReader(GGUFReader):  # type: ignore[misc, valid-type]
        def _build_fields(self, offs: int, count: int) -> int:  # gguf's own, but for arrays
            for _ in range(count):
                orig_offs = offs
                klen, kdata = self._get_str(offs)
                offs += int(klen.nbytes + kdata.nbytes)
                raw_type = self._get(offs, np.uint32)
                offs += int(raw_type.nbytes)
                head = [klen, kdata, raw_type]
                got = _array_field(self, offs, head) if int(raw_type[0]) == GGUFValueType.ARRAY else None
                if got is None:
                    size, fparts, fidx, types = self._get_field_parts(offs, raw_type[0])
                    got = size, head + fparts, [i + len(head) for i in fidx], types
                size, parts, data, types = got
                self._push_field(ReaderField(orig_offs, str(bytes(kdata), encoding="utf-8"), parts, data, types),
                                 skip_sum=True)
                offs += size
            return offs

        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            for f in fields:
                raw = int(f.parts[4][0])
                if raw not in GGMLQuantizationType._value2member_map_:
                    name = str(bytes(f.parts[1]), encoding="utf-8", errors="replace")
                    raise ValueError(f"tensor {name!r} has ggml type {raw}, which is not a valid GGMLQuantizationType "
                                     "this gguf package reads")
            super()._build_tensors(start_offs, fields)

    return NamedReader


def parse_gguf(path: Path) -> Any:
    try:
        return _named_reader()(str(path))
    except ValueError as exc:
        msg = str(exc)
        if "GGMLQuantizationType" in msg:
            raise ValidationError(f"GGUF file {path} holds a tensor of an unknown type ({msg})") from exc
        if "cannot reshape" in msg:  # the reader views each tensor's bytes: too few of them at the end
            raise ValidationError(f"GGUF file {path} is truncated: its last tensor's data ends early ({msg})") from exc
        raise ValidationError(f"GGUF file {path} is malformed ({msg})") from exc
    except (IndexError, KeyError, OverflowError, MemoryError, OSError, TypeError) as exc:
        raise ValidationError(f"GGUF file {path} is malformed or truncated ({type(exc).__name__}: {exc})") from exc


def release_pages(path: Path) -> None:
    """Drop the cached reader's mapped pages from this process's resident set (they stay in the page cache: a later
    read faults them back in). After a load has copied what it keeps, the file's pages would otherwise count in the
    RSS for as long as the reader stays cached."""
    import mmap
    m = getattr(read_gguf(path).data, "_mmap", None)
    if m is not None and hasattr(m, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        m.madvise(mmap.MADV_DONTNEED)


def forget() -> None:
    """Drop the cached parse (every file's: the cache holds two at most) once a load and its tokenizer have what they
    need: the reader's Python objects (one numpy view per vocabulary entry, ~160 MB for SmolLM2's 49k tokens and
    merges) and its file mapping then go with the last reference (issue 44: RSS after load). A later read parses
    the file again (no file is read here: the loader's ``release_pages`` gave the mapped pages back while the parse
    was still cached)."""
    _cached.cache_clear()


@contextmanager
def shared_reader(path: Path) -> Iterator[None]:
    """While inside, ``gguf.GGUFReader(path)`` (and only for this file, opened read-only) returns the cached
    reader; any other file is parsed as usual. One patch at a time (a lock), restored on the way out."""
    import gguf

    reader, target, original = read_gguf(path), str(path.resolve()), gguf.GGUFReader

    def reader_for(p: Any, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs and str(Path(p).resolve()) == target:
            return reader
        return original(p, *args, **kwargs)

    with _PATCH_LOCK:
        gguf.GGUFReader = reader_for  # type: ignore[misc]
        try:
            yield
        finally:
            gguf.GGUFReader = original  # type: ignore[misc]
