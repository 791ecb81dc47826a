"""One parse of a GGUF file per load. ``gguf.GGUFReader`` maps the file and walks every field and tensor
header, which takes seconds on a real checkpoint; our loader, transformers' config helper and its tokenizer
helper would each parse it again. ``read_gguf`` caches the parsed reader per (file, size, mtime), and
``shared_reader`` hands that reader to transformers' helpers, which construct ``gguf.GGUFReader`` by name
inside their functions, for the duration of one call."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from mindie_service.errors import ValidationError

_PATCH_LOCK = threading.Lock()


def read_gguf(path: Path) -> Any:
    """The parsed reader of ``path`` (a ValidationError naming the file when it is not a readable GGUF)."""
    st = path.stat()
    return _cached(str(path.resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=2)
def _cached(file: str, size: int, mtime_ns: int) -> Any:
    return parse_gguf(Path(file))


def _named_reader() -> Any:
    """gguf.GGUFReader whose tensor of an unknown type fails naming the tensor and the type's number."""
    from gguf import GGMLQuantizationType, GGUFReader

    class NamedReader(GGUFReader):  # type: ignore[misc, valid-type]
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
