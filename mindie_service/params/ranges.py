"""A numeric interval and how a message prints it (``in (0, 1.0]``, ``> 0.0``)."""
from __future__ import annotations

from dataclasses import dataclass

INT32_MAX = 2147483647
UINT64_MAX = 2**64 - 1
F32_TINY = 1.1754943508222875e-38  # smallest normal float32
F32_MAX = 3.4028234663852886e38


def _fmt(x: float | None) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return f"{x:.1f}"
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Range:
    """A numeric interval; ``str()`` gives the rule as messages print it: ``in (0, 1.0]`` or ``> 0.0``."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = True
    hi_open: bool = False

    def __contains__(self, v: float) -> bool:
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        if self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi):
            return False
        return True

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {_fmt(self.lo)}" if self.lo is not None else "a number"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {_fmt(self.hi)}"
        return f"in {'(' if self.lo_open else '['}{_fmt(self.lo)}, {_fmt(self.hi)}{')' if self.hi_open else ']'}"


def closed(lo: float, hi: float | None = None) -> Range:
    """``[lo, hi]`` (``>= lo`` without ``hi``)."""
    return Range(lo, hi, lo_open=False)
