"""``keep_alive``: how long a model stays loaded after a request, Ollama's semantics (its ``api.Duration``):
a number of seconds, or a duration string as Go's ``time.ParseDuration`` reads it ("5m", "1h30m", "300ms",
"-1s"); ``0`` unloads the model once the request is done, any negative value keeps it loaded until it is stopped
or evicted. A top-level field of the body of every route that serves a model (generation, embeddings, tokenize,
batch jobs), taken out before the dialect's parser and given to the model lookup (one door)."""
from __future__ import annotations

import math
import re
from typing import Any

from mindie_service.errors import ValidationError

FOREVER = math.inf
MAX_KEEP_ALIVE_S = 10 * 365 * 86400.0  # beyond ten years: say -1
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
# The field in the OpenAPI documents (server/openapi.py, protocol/tokenization.py)
OPENAPI_SCHEMA = {"oneOf": [{"type": "number"}, {"type": "string"}],
                  "description": "how long the model stays loaded after this request: seconds or a duration "
                                 "(\"5m\"); 0 unloads it after the request, a negative value keeps it loaded"}
_RULE = ('a number of seconds or a duration such as "5m", "1h30m", "300ms" (0 = unload after this request, '
         'a negative value = keep loaded)')


def _duration(text: str) -> float:
    """Go's ParseDuration: an optional sign, then one or more number+unit parts ("0" alone is allowed)."""
    s = text.strip()
    sign = -1.0 if s.startswith("-") else 1.0
    body = s.lstrip("+-") if s[:1] in "+-" else s
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(text)
    pos, total = 0, 0.0
    while pos < len(body):
        m = _PART.match(body, pos)
        if m is None:
            raise ValueError(text)
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total


def parse_keep_alive(value: Any) -> float | None:
    """Seconds to keep the model loaded after the request (``FOREVER`` for a negative value, 0 to unload at
    once); None when absent. A ValidationError naming the rule for anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValidationError(f"Parameter keep_alive must be {_RULE}, got {value!r}")
    if isinstance(value, str):
        try:
            secs = float(value) if re.fullmatch(r"[+-]?\d+(\.\d+)?", value.strip()) else _duration(value)
        except ValueError:
            raise ValidationError(f"Parameter keep_alive must be {_RULE}, got {value!r}") from None
    else:
        secs = float(value)
    if math.isnan(secs) or (secs > MAX_KEEP_ALIVE_S and not math.isinf(secs)) or secs == math.inf:
        raise ValidationError(f"Parameter keep_alive must be {_RULE} (at most {MAX_KEEP_ALIVE_S:.0f} s), "
                              f"got {value!r}")
    return FOREVER if secs < 0 else secs


def take_keep_alive(body: Any) -> float | None:
    """``keep_alive`` removed from a request body (the dialects' own parsers never see it) and parsed."""
    if not isinstance(body, dict) or "keep_alive" not in body:
        return None
    return parse_keep_alive(body.pop("keep_alive"))
