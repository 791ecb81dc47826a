"""Triton's binary tensor data extension (Triton docs, protocol/extension_binary_data.md), inputs only: the
body is a JSON header of ``Inference-Header-Content-Length`` bytes, then each input whose
``parameters.binary_data_size`` is set, in order, as raw bytes: BYTES elements as a 4-byte little-endian length
and the bytes, INT32 / INT64 as little-endian integers. Decoded here into the JSON ``data`` the parser reads
(tritonclient sends its inputs so by default). Answers stay JSON, which tritonclient reads as well."""
from __future__ import annotations

import sys
from array import array
from typing import Any

from mindie_service.errors import BadRequestError, check
from mindie_service.protocol.validation import parse_json_body

_INTS = {"INT32": ("i", 4), "INT64": ("q", 8)}


def _bytes_elements(chunk: bytes, name: str) -> list[str]:
    out, i = [], 0
    while i < len(chunk):
        check(i + 4 <= len(chunk), f"{name} binary data", "whole 4-byte length prefixes", len(chunk) - i)
        n = int.from_bytes(chunk[i:i + 4], "little")
        check(i + 4 + n <= len(chunk), f"{name} binary data", f"an element of {n} bytes", len(chunk) - i - 4)
        try:
            out.append(chunk[i + 4:i + 4 + n].decode("utf-8"))
        except UnicodeDecodeError:
            raise BadRequestError(f"{name} binary data: element {len(out)} is not valid UTF-8") from None
        i += 4 + n
    return out


def _decode(chunk: bytes, datatype: Any, name: str) -> list[Any]:
    if datatype == "BYTES":
        return _bytes_elements(chunk, name)
    check(datatype in _INTS, f"{name}.datatype", "BYTES, INT32 or INT64", datatype)
    code, width = _INTS[datatype]
    check(len(chunk) % width == 0, f"{name} binary data", f"a multiple of {width} bytes", len(chunk))
    a = array(code)
    a.frombytes(chunk)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tolist()


def read_binary_request(raw: bytes, header_len: str) -> dict[str, Any]:
    """A binary-extension body -> the JSON request with every binary input's ``data`` filled in."""
    check(header_len.isdigit() and int(header_len) <= len(raw), "Inference-Header-Content-Length",
          f"a byte count within the body ({len(raw)} bytes)", header_len)
    n = int(header_len)
    body = parse_json_body(raw[:n], "application/json")
    rest, at = raw[n:], 0
    for t in body.get("inputs") if isinstance(body.get("inputs"), list) else []:
        params = t.get("parameters") if isinstance(t, dict) else None
        size = params.pop("binary_data_size", None) if isinstance(params, dict) else None
        if size is None:
            continue
        check(type(size) is int and 0 <= size <= len(rest) - at, f"{t.get('name')}.parameters.binary_data_size",
              f"at most the {len(rest) - at} bytes left in the body", size)
        t["data"] = _decode(rest[at:at + size], t.get("datatype"), str(t.get("name")))
        at += size
    check(at == len(rest), "the body", f"{n} header bytes plus the inputs' binary_data_size", len(raw))
    return body
