"""One ``POST /v1/files`` body, parsed as it arrives (python-multipart's streaming parser): the ``file`` part is
written straight to a file under the store's ``tmp/``, never held in memory; the other parts (``purpose``) are
small fields kept (each at most FIELD_MAX bytes). Past ``max_bytes`` of file data the partial file is deleted
and the rest of the body is counted and dropped, so the handler can answer 413 after reading it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from python_multipart.multipart import MultipartParseError, MultipartParser, parse_options_header

from mindie_service.errors import BadRequestError

FIELD_MAX = 1024
FILE_FIELD = "file"


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/form-data`` Content-Type; 400 naming what is wrong otherwise."""
    ctype, opts = parse_options_header(content_type or "")
    if ctype != b"multipart/form-data" or not opts.get(b"boundary"):
        raise BadRequestError("POST /v1/files takes a multipart/form-data body (fields file and purpose), got "
                              f"Content-Type {(content_type or 'none')[:100]!r}")
    return opts[b"boundary"]


class Upload:
    def __init__(self, boundary: bytes, tmp: Path, max_bytes: int) -> None:
        self.tmp, self.max_bytes = tmp, max_bytes
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.file_bytes = 0
        self.too_large = False
        self.error: str | None = None
        self.ended = False
        self._out: BinaryIO | None = None
        self._headers: dict[bytes, bytes] = {}
        self._field: bytes = b""
        self._value: bytes = b""
        self._name: str | None = None
        self._buf = bytearray()
        self._parser = MultipartParser(boundary, {
            "on_part_begin": self._part_begin, "on_header_field": self._hfield, "on_header_value": self._hvalue,
            "on_header_end": self._hend, "on_headers_finished": self._headers_done, "on_part_data": self._data,
            "on_part_end": self._part_end, "on_end": self._end})

    # -- parser callbacks ---------------------------------------------------------------------------
    def _part_begin(self) -> None:
        self._headers, self._name, self._buf = {}, None, bytearray()

    def _hfield(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _hvalue(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _hend(self) -> None:
        self._headers[self._field.lower()] = self._value
        self._field, self._value = b"", b""

    def _headers_done(self) -> None:
        _, opts = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = opts.get(b"name", b"").decode("utf-8", "replace")
        if self._name in self.fields or (self._name == FILE_FIELD and self.filename is not None):
            self.error = f"the field {self._name!r} is sent twice"
        elif self._name == FILE_FIELD:
            self.filename = os.path.basename(opts.get(b"filename", b"upload.jsonl").decode("utf-8", "replace"))
            self._out = open(self.tmp, "wb")

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._name == FILE_FIELD:
            self.file_bytes += end - start
            if self.file_bytes > self.max_bytes:
                self._drop()
            elif self._out is not None:
                self._out.write(data[start:end])
        elif len(self._buf) + end - start <= FIELD_MAX:
            self._buf += data[start:end]
        else:
            self.error = f"the field {self._name!r} is longer than {FIELD_MAX} bytes"

    def _part_end(self) -> None:
        if self._name is not None and self._name != FILE_FIELD:
            self.fields[self._name] = self._buf.decode("utf-8", "replace")

    def _end(self) -> None:
        self.ended = True

    # -- the handler's side -------------------------------------------------------------------------
    def feed(self, chunk: bytes) -> None:
        """Parse ``chunk`` (off the IO loop: it writes to disk); past an error or the cap, only count it."""
        if self.error is not None or self.too_large:
            return
        try:
            self._parser.write(chunk)
        except (MultipartParseError, ValueError) as e:  # a malformed body, never a 500
            self.error = f"the multipart body does not parse: {e}"
        if self.error is not None:
            self.discard()

    def _drop(self) -> None:
        self.too_large = True
        self.discard()

    def finish(self) -> None:
        """The file flushed to disk and closed; 400 when the body was not a whole form."""
        if self.error is None and not self.ended:
            self.error = "the multipart body ended before its closing boundary"
        if self.error is not None:
            self.discard()
            raise BadRequestError(f"Parameter file: {self.error}")
        if self._out is not None:
            self._out.flush()
            os.fsync(self._out.fileno())
            self._out.close()
            self._out = None

    def discard(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None
        self.tmp.unlink(missing_ok=True)
