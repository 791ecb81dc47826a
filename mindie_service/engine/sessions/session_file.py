"""The spilled-session file (engine.sessions.session_spill): a kept /api/* session's tokens and KV blocks, versioned,
checksummed and tied to the model that computed them.

Layout (all integers big-endian)::

    b"MISESS" + version (2 bytes)
    header length (4 bytes) + header (JSON, UTF-8)
    token ids (int64 each)                       header["num_tokens"] of them
    KV bytes                                      header["kv_bytes"]: [blocks, layers, 2, block_size, kv_heads, row]
    SHA-256 of everything before the KV bytes (32 bytes), SHA-256 of the KV bytes (32 bytes)

The header names the session, the model identity (``ModelIdentity``: weights fingerprint, dtype, block
size, KV dtype, KV shape) and the KV tensor's dtype and shape. Reading checks the magic, the version, the
sizes and the first checksum before trusting the tokens; the KV bytes are used only when their checksum
and the identity match (``SessionFile.kv`` is None otherwise: the session is recomputed from its tokens)."""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass
from typing import Any

from mindie_service.errors import ValidationError

MAGIC = b"MISESS"
VERSION = 1
_SHA = 32


@dataclass(frozen=True)
class ModelIdentity:
    weights: str  # fingerprint of the checkpoint (session_spill.weights_fingerprint)
    dtype: str
    block_size: int
    kv_dtype: str
    kv_shape: tuple[int, ...]  # (layers, 2, block_size, kv_heads, row) of one block

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "kv_shape": list(self.kv_shape)}


@dataclass
class SessionFile:
    key: str
    tokens: tuple[int, ...]
    identity: dict[str, Any]
    kv_dtype: str  # torch dtype name of the KV bytes
    kv_shape: tuple[int, ...]  # [blocks, layers, 2, block_size, kv_heads, row]
    kv: bytes | None  # None: absent, damaged, or not this model's


def encode(key: str, tokens: tuple[int, ...], identity: ModelIdentity, kv_dtype: str, kv_shape: tuple[int, ...],
           kv: bytes) -> bytes:
    header = json.dumps({"version": VERSION, "session": key, "num_tokens": len(tokens), "identity": identity.as_json(),
                         "kv_dtype": kv_dtype, "kv_shape": list(kv_shape), "kv_bytes": len(kv)}).encode()
    head = MAGIC + struct.pack(">H", VERSION) + struct.pack(">I", len(header)) + header
    head += struct.pack(f">{len(tokens)}q", *tokens)
    return head + kv + hashlib.sha256(head).digest() + hashlib.sha256(kv).digest()


def decode(data: bytes, identity: ModelIdentity, max_bytes: int) -> SessionFile:
    """ValidationError when the file cannot be trusted at all (tokens included); ``kv`` None when only the KV
    part is unusable (damaged, or another model's)."""
    if len(data) > max_bytes:
        raise ValidationError(f"session file of {len(data)} bytes is over the cap of {max_bytes}")
    if len(data) < len(MAGIC) + 6 + 2 * _SHA or not data.startswith(MAGIC):
        raise ValidationError("not a session file")
    (version,) = struct.unpack_from(">H", data, len(MAGIC))
    if version != VERSION:
        raise ValidationError(f"session file version {version}, this server reads {VERSION}")
    (hlen,) = struct.unpack_from(">I", data, len(MAGIC) + 2)
    start = len(MAGIC) + 6
    try:
        header = json.loads(data[start:start + hlen])
        n, kv_len = int(header["num_tokens"]), int(header["kv_bytes"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValidationError("session file header is damaged") from exc
    tok_end = start + hlen + 8 * n
    if n < 1 or kv_len < 0 or tok_end + kv_len + 2 * _SHA != len(data):
        raise ValidationError("session file sizes do not add up")
    if hashlib.sha256(data[:tok_end]).digest() != data[tok_end + kv_len:tok_end + kv_len + _SHA]:
        raise ValidationError("session file checksum mismatch (damaged)")
    tokens = struct.unpack_from(f">{n}q", data, start + hlen)
    kv: bytes | None = data[tok_end:tok_end + kv_len]
    if hashlib.sha256(kv).digest() != data[-_SHA:] or header.get("identity") != identity.as_json():
        kv = None
    return SessionFile(str(header.get("session", "")), tuple(tokens), header.get("identity", {}),
                       str(header.get("kv_dtype", "")), tuple(header.get("kv_shape", ())), kv)
