"""Sampling parameters in vLLM's shape (the offline API and the engine's own request type)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from mindie_service.errors import check

INT32_MAX = 2147483647
UINT64_MAX = 2**64 - 1
MAX_STOP_STRINGS = 32
MAX_STOP_LEN = 1024
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # OpenAI's cap on logit_bias entries
MAX_BEAMS = 8
# The adapter name that means "the base model" (MindIE's adapter_id default); the offline API also takes None.
BASE_ADAPTER = "None"


def is_base_adapter(name: str | None) -> bool:
    return name is None or name == BASE_ADAPTER


def unknown_adapter_message(name: object) -> str:
    """The one wording of an unknown adapter_id (422 on MindIE/TGI routes, ValueError offline)."""
    return f"Parameter adapter_id must name a loaded LoRA adapter or \"{BASE_ADAPTER}\", got {name!r}"


@dataclass
class SamplingParams:
    """How one request is decoded.

    temperature 0 means greedy. top_k <= 0 and top_p == 1.0 and typical_p == 1.0 mean off.
    ``logprobs`` is the number of top alternatives returned per generated token (None: none;
    the chosen token's own logprob is always returned). ``prompt_logprobs`` asks for the
    logprob of each prompt token. ``adapter_id`` names a LoRA adapter (None: base model).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from the logit of every token already generated
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit (OpenAI's)
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: bool = False
    adapter_id: str | None = None
    # Beam search (HF generate's semantics; greedy only): num_beams > 1 searches that many beams.
    num_beams: int = 1
    length_penalty: float = 1.0  # final score = sum of logprobs / generated_length ** length_penalty
    early_stopping: bool | str = False  # True, False (HF's heuristic) or "never"

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            self.stop = list(self.stop)
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        """Raise ValueError (a ValidationError) naming the parameter, the rule and the value."""
        _int(self.max_tokens, "max_tokens", 1, INT32_MAX)
        _num(self.temperature, "temperature")
        check(self.temperature >= 0.0, "temperature", ">= 0 (0 = greedy)", self.temperature)
        check(isinstance(self.top_k, int) and not isinstance(self.top_k, bool), "top_k", "an integer", self.top_k)
        _num(self.top_p, "top_p")
        check(0.0 < self.top_p <= 1.0, "top_p", "in (0, 1]", self.top_p)
        _num(self.typical_p, "typical_p")
        check(0.0 < self.typical_p <= 1.0, "typical_p", "in (0, 1]", self.typical_p)
        _num(self.repetition_penalty, "repetition_penalty")
        check(self.repetition_penalty > 0.0, "repetition_penalty", "> 0", self.repetition_penalty)
        _num(self.frequency_penalty, "frequency_penalty")
        check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "in [-2, 2]", self.frequency_penalty)
        _num(self.presence_penalty, "presence_penalty")
        check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "in [-2, 2]", self.presence_penalty)
        check(isinstance(self.logit_bias, dict) and len(self.logit_bias) <= MAX_LOGIT_BIAS, "logit_bias",
              f"an object of at most {MAX_LOGIT_BIAS} token ids", len(self.logit_bias))
        for tid, bias in self.logit_bias.items():
            _int(tid, "logit_bias key", 0, INT32_MAX)
            _num(bias, f"logit_bias[{tid}]")
            check(-100.0 <= bias <= 100.0, f"logit_bias[{tid}]", "in [-100, 100]", bias)
        if self.seed is not None:
            _int(self.seed, "seed", 0, UINT64_MAX)
        check(len(self.stop) <= MAX_STOP_STRINGS, "stop", f"at most {MAX_STOP_STRINGS} strings", len(self.stop))
        for s in self.stop:
            check(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LEN, "stop",
                  f"a list of non-empty strings of at most {MAX_STOP_LEN} characters", s)
        if self.logprobs is not None:
            _int(self.logprobs, "logprobs", 0, MAX_TOP_LOGPROBS)
        _int(self.num_beams, "num_beams", 1, MAX_BEAMS)
        _num(self.length_penalty, "length_penalty")
        check(self.early_stopping in (True, False, "never"), "early_stopping", 'True, False or "never"',
              self.early_stopping)
        if self.num_beams > 1:
            check(self.greedy, "num_beams", "1 when sampling (temperature > 0): beam sampling is not supported",
                  self.num_beams)


def _num(v: object, name: str) -> None:
    check(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), name, "a finite number", v)


def _int(v: object, name: str, lo: int, hi: int) -> None:
    check(isinstance(v, int) and not isinstance(v, bool), name, "an integer", v)
    check(lo <= v <= hi, name, f"in [{lo}, {hi}]", v)  # type: ignore[operator]
