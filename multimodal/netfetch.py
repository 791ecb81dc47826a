"""http(s) media URLs through the guard (``mindie_service.netguard``: host allow-list, one DNS lookup whose every address is
checked, a connection pinned to the checked address, no redirects, timeouts, the byte cap while the body
streams in), with the media layer's own part on top: the request's byte budget, the early format sniff, and
spooling a large video to a temporary file. Every failure is a ``MediaError`` (4xx) naming the part."""
from __future__ import annotations

import logging

from mindie_service.netguard import Address, CheckedURL, check_url, pinned_get

from .budget import ByteBudget
from .policy import MediaKind, MediaPolicy, where
from .sniff import SNIFF_BYTES, require_format
from .spool import MediaBytes, Spooler

logger = logging.getLogger(__name__)


class _MediaSink:
    """Takes the guarded body: charges the request's budget, spools, and sniffs the format once the first
    bytes are in (a wrong format stops the download early)."""

    def __init__(self, kind: MediaKind, index: int, budget: ByteBudget | None, spooler: Spooler) -> None:
        self.kind, self.index, self.budget, self.body = kind, index, budget, spooler
        self.sniffed = False

    def expect(self, length: int) -> None:
        pass

    def write(self, chunk: bytes) -> None:
        if self.budget is not None:
            self.budget.take(len(chunk), self.index, self.kind)
        self.body.write(chunk)
        if not self.sniffed and self.body.size >= SNIFF_BYTES:
            self.sniffed = True
            require_format(self.body.head(), self.kind, self.index)


async def fetch_url(ref: str, kind: MediaKind, index: int, policy: MediaPolicy,
                    budget: ByteBudget | None) -> MediaBytes:
    """The guarded fetch of a media URL (checks, then the pinned GET); a video past ``policy.spool_bytes``
    is spooled to a temporary file."""
    target = await check_url(ref, policy.url_limits(kind), where(index, kind))
    return await http_get_media(ref, target.host, list(target.addresses), kind, index, policy, budget)


async def http_get(url: str, host: str, addresses: list[Address], kind: MediaKind,
                   index: int, policy: MediaPolicy, budget: ByteBudget | None) -> bytes:
    """``http_get_media``'s body as bytes, held in memory."""
    with await http_get_media(url, host, addresses, kind, index, policy, budget, spool=False) as blob:
        assert blob.data is not None
        return blob.data


async def http_get_media(url: str, host: str, addresses: list[Address], kind: MediaKind, index: int,
                         policy: MediaPolicy, budget: ByteBudget | None, *, spool: bool = True) -> MediaBytes:
    """GET ``url`` connecting only to ``addresses`` (already checked), Host header and TLS SNI still ``host``.
    No redirects, caps enforced while streaming; a large video is spooled to a temporary file as it arrives
    (``spool``)."""
    spooler = Spooler(policy.spool_threshold(kind) if spool else None, policy.spool_dir)
    sink = _MediaSink(kind, index, budget, spooler)
    target = CheckedURL(url, host, 0, tuple(addresses))
    try:
        await pinned_get(target, policy.url_limits(kind), where(index, kind), sink)
    except BaseException:  # failed, refused or cancelled: a spooled file goes at once
        spooler.discard()
        raise
    return spooler.finish()
