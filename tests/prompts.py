"""Deterministic prompts for engine tests."""
from __future__ import annotations

import random

WORDS = ("river mountain city garden teacher window morning silver quiet market engine story "
         "harbor lantern winter bridge orange violin forest letter museum thunder candle meadow "
         "pilot ocean castle rabbit desert island planet doctor kitchen mirror").split()


def word_prompts(n: int, lo: int, hi: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lengths = [lo + (hi - lo) * i // max(1, n - 1) for i in range(n)]
    rng.shuffle(lengths)
    return [" ".join(rng.choice(WORDS) for _ in range(k)).capitalize() for k in lengths]
