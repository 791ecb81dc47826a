"""API keys, OpenAI's way (``Authorization: Bearer <key>``) or Anthropic's (``x-api-key: <key>``), per plane.

Keys come from ServerConfig.businessApiKeys / managementApiKeys / metricsApiKeys (hashed when the config is
loaded) and from ServerConfig.apiKeyFile (``<plane> sha256:<hex>`` a line), read at start and on SIGHUP. A
presented key is hashed and compared with every stored hash of its plane in constant time
(``hmac.compare_digest``); keys are never logged. A plane with no key asks for none, except ``admin``: the
management routes served on the business port (ServerConfig.managementRoutesOnBusinessPort), which need a
management key and are refused while there is none. /health and the liveness / readiness probes stay open."""
from __future__ import annotations

import hashlib
import hmac
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindie_service.errors import ConfigError, ForbiddenError, MindieError, UnauthorizedError

logger = logging.getLogger(__name__)

PLANES = ("business", "management", "metrics")
ADMIN = "admin"  # management keys, always asked
OPEN_PATHS = frozenset({"/health", "/v2/health/live", "/v2/health/ready"})
_LINE = re.compile(r"^(business|management|metrics)\s+sha256:([0-9a-fA-F]{64})$")


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", errors="surrogatepass")).digest()


def read_key_file(path: str) -> list[tuple[str, str]]:
    """(plane, hex digest) of each line of ``path``; ConfigError naming the line of a bad one."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"ServerConfig.apiKeyFile {path}: cannot read it: {getattr(e, 'strerror', None) or e}")
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if m is None:  # the line is not quoted: it may be a key pasted in plain text
            raise ConfigError(f"ServerConfig.apiKeyFile {path}:{n}: expected `<business|management|metrics> "
                              "sha256:<64 hex digits>`")
        out.append((m.group(1), m.group(2).lower()))
    return out


@dataclass(frozen=True)
class KeyRing:
    """plane -> the SHA-256 digests of its keys."""

    hashes: dict[str, tuple[bytes, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, pairs: list[tuple[str, str]]) -> "KeyRing":
        return cls({p: tuple(bytes.fromhex(h) for q, h in pairs if q == p) for p in PLANES})

    def keys_of(self, plane: str) -> tuple[bytes, ...]:
        return self.hashes.get("management" if plane == ADMIN else plane, ())

    def asks(self, plane: str) -> bool:
        return plane == ADMIN or bool(self.keys_of(plane))

    def accepts(self, plane: str, key: str) -> bool:
        digest, ok = key_hash(key), False
        for h in self.keys_of(plane):  # every stored hash compared: the time does not say which matched
            ok |= hmac.compare_digest(digest, h)
        return ok


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class Auth:
    """The keys in force; ``reload`` re-reads the key file (SIGHUP), keeping the old keys if it fails."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.ring = self._load()

    def _load(self) -> KeyRing:
        pairs = list(self.settings.api_key_hashes)
        if self.settings.api_key_file:
            pairs += read_key_file(self.settings.api_key_file)
        return KeyRing.of(pairs)

    def reload(self) -> None:
        try:
            self.ring = self._load()
        except ConfigError as e:
            logger.error("API keys not reloaded, the previous ones stay: %s", e)
            return
        logger.info("API keys reloaded: %s", ", ".join(f"{p} {len(self.ring.keys_of(p))}" for p in PLANES))

    def check(self, plane: str, path: str, authorization: str | None,
              api_key: str | None = None) -> MindieError | None:
        """None when the request may pass; else the error to answer (401, or 403 for admin routes with no key).
        ``api_key``: an ``x-api-key`` header (Anthropic's clients send the key there), taken beside the bearer."""
        ring = self.ring
        if path in OPEN_PATHS or not ring.asks(plane):
            return None
        if plane == ADMIN and not ring.keys_of(plane):
            return ForbiddenError(f"{path} is served on the management port ({self.settings.management_port}); "
                                  "on the business port it needs a management key and none is set")
        key = bearer(authorization) or (api_key.strip() or None if api_key else None)
        if key is None:
            return UnauthorizedError("an API key is required: send `Authorization: Bearer <key>` (or `x-api-key: "
                                     "<key>`)")
        if not ring.accepts(plane, key):
            return UnauthorizedError("the API key is not valid here")
        return None


def request_error(handler: Any) -> MindieError | None:
    """The key check of ``handler``'s request, by its application's route access (server/app.py): the plane
    its method asks keys of; None when it may pass."""
    settings = handler.application.settings
    auth: Auth | None = settings.get("auth")
    if auth is None:
        return None
    access = settings.get("access", {}).get(type(handler), {})
    r = handler.request
    plane = access.get(r.method.lower(), access.get("*", settings.get("default_plane", "business")))
    return auth.check(plane, r.path, r.headers.get("Authorization"), r.headers.get("X-Api-Key"))
