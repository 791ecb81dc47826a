"""Triton's binary tensor data extension (Triton docs, protocol/extension_binary_data.md): the body is a JSON
header of ``Inference-Header-Content-Length`` bytes, then each tensor whose ``parameters.binary_data_size`` is
set, in order, as raw bytes: BYTES elements as a 4-byte little-endian length and the bytes, INT32 / INT64 as
little-endian integers. Requests are decoded here into the JSON ``data`` the parser reads (tritonclient sends its
inputs so by default); answers are encoded so for the outputs asked for as binary (``binary_data``,
``binary_data_output``: tritonclient asks by default)."""
from __future__ import annotations

import json
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


def _encode(data: list[Any], datatype: str) -> bytes:
    if datatype == "BYTES":
        return b"".join(len(b).to_bytes(4, "little") + b for b in (str(v).encode("utf-8") for v in data))
    a = array(_INTS[datatype][0], data)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def binary_answer(answer: dict[str, Any], names: frozenset[str]) -> tuple[bytes, int] | None:
    """``answer`` (an infer response with JSON ``data``) with the outputs in ``names`` moved behind its JSON
    header as binary data: (the body, the header's length for ``Inference-Header-Content-Length``); None when
    no output is binary (a plain JSON answer)."""
    if not names:
        return None
    blobs: list[bytes] = []
    for out in answer["outputs"]:
        if out["name"] in names:
            raw = _encode(out.pop("data"), out["datatype"])
            out["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
    header = json.dumps(answer, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return header + b"".join(blobs), len(header)
