"""One JSONL input line -> chat messages: a JSON list of the seed's ``Message`` objects
(``role``, ``text``, ``attachments`` of ``MediaAttachment``). A line that does not validate becomes
an error record; it never fails the job."""
from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from mindie_service.errors import ValidationError
from mindie_service.inputs import ChatMessage, ChatPrompt, MediaItem

ROLES = ("system", "user", "assistant")
MEDIA_KINDS = ("image", "video", "audio")
_MIME = {"video": "video/mp4", "audio": "audio/wav"}


def split_lines(data: bytes) -> list[bytes]:
    """The input's lines, blank lines dropped (they are not conversations)."""
    return [ln for ln in data.split(b"\n") if ln.strip()]


def _media_ref(att: dict[str, Any], kind: str, where: str) -> str:
    data_type, data = att.get("data_type"), att.get("data")
    if not isinstance(data, str) or not data:
        raise ValidationError(f"{where}.data must be a non-empty string")
    if data_type == "raw_bytes":
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ValidationError(f"{where}.data must be base64 for data_type raw_bytes") from None
        mime = _MIME.get(kind) or ("image/png" if raw.startswith(b"\x89PNG") else "image/jpeg")
        return f"data:{mime};base64,{data}"
    if data_type in ("filepath", "uri"):
        return data  # a server-local path or a URL: the media layer's guards decide
    raise ValidationError(f"{where}.data_type must be one of raw_bytes, filepath, uri, got {data_type!r}")


def parse_line(raw: bytes) -> ChatPrompt:
    """Raise ValidationError naming what is wrong with the line."""
    try:
        msgs = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValidationError(f"the line is not valid JSON: {e}") from None
    if not isinstance(msgs, list) or not msgs:
        raise ValidationError("the line must be a non-empty JSON list of messages")
    out: list[ChatMessage] = []
    media_index = 0
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ValidationError(f"{where} must be an object")
        role, text = m.get("role"), m.get("text", "")
        if role not in ROLES:
            raise ValidationError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(text, str):
            raise ValidationError(f"{where}.text must be a string")
        parts: list[Any] = [text] if text else []
        atts = m.get("attachments") or []
        if not isinstance(atts, list):
            raise ValidationError(f"{where}.attachments must be a list")
        for j, att in enumerate(atts):
            aw = f"{where}.attachments[{j}]"
            if not isinstance(att, dict):
                raise ValidationError(f"{aw} must be an object")
            kind = att.get("attachment_type")
            if kind == "text":
                if att.get("data_type") != "raw_bytes" or not isinstance(att.get("data"), str):
                    raise ValidationError(f"{aw}: a text attachment must carry its text as data_type raw_bytes")
                parts.append(att["data"])
            elif kind in MEDIA_KINDS:
                parts.append(MediaItem(media_index, kind, _media_ref(att, kind, aw)))
                media_index += 1
            else:
                raise ValidationError(f"{aw}.attachment_type must be one of image, video, audio, text, got {kind!r}")
        if not parts:
            raise ValidationError(f"{where} has no text and no attachments")
        only_text = all(isinstance(p, str) for p in parts)
        out.append(ChatMessage(role, "\n".join(parts) if only_text else tuple(parts)))
    return ChatPrompt(tuple(out))
