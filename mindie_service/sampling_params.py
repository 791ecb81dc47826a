"""Sampling parameters in vLLM's shape (the offline API and the engine's own request type)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from mindie_service.errors import check
from mindie_service.params.adapter_name import BASE_ADAPTER, is_base_adapter, unknown_adapter_message
from mindie_service.params.ranges import INT32_MAX, UINT64_MAX
from mindie_service.structured.grammar_spec import StructuredSpec, from_vllm
from mindie_service.params.table import (ENGINE, LOGIT_BIAS, MAX_BEAMS, MAX_LOGIT_BIAS, MAX_STOP_LEN,
                                         MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, TOKEN_ID)

__all__ = ["BASE_ADAPTER", "INT32_MAX", "MAX_BEAMS", "MAX_LOGIT_BIAS", "MAX_STOP_LEN", "MAX_STOP_STRINGS",
           "MAX_TOP_LOGPROBS", "UINT64_MAX", "SamplingParams", "is_base_adapter", "unknown_adapter_message"]


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
    min_p: float = 0.0  # vLLM's: drop tokens less likely than min_p x the most likely one (after top-k/top-p)
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from the logit of every token already generated
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit (OpenAI's)
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: tuple[int, ...] = ()  # vLLM's: generating one of these ends the request (finish "stop")
    min_tokens: int = 0  # vLLM's: before this many output tokens, EOS and stop_token_ids are never drawn, nothing stops
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: bool = False
    adapter_id: str | None = None
    # Beam search (HF generate's semantics; greedy only): num_beams > 1 searches that many beams.
    num_beams: int = 1
    length_penalty: float = 1.0  # final score = sum of logprobs / generated_length ** length_penalty
    early_stopping: bool | str = False  # True, False (HF's heuristic) or "never"
    # Structured output (vLLM's shape: an object or dict of json | regex | choice | grammar | json_object, or a
    # structured.grammar_spec.StructuredSpec): the output matches it; None: unconstrained.
    structured_outputs: StructuredSpec | None = None
    # A client's prompt-cache key (OpenAI's prompt_cache_key): requests naming one key go to one instance where
    # several serve the model (fleet.prefix_routing), so their shared prefix is cached once. No effect on output.
    cache_key: str | None = None
    # Reasoning (engine.output.reasoning; a model whose chat template thinks): split_reasoning hands the thinking
    # out apart from the answer; thinking_budget caps the thinking tokens (the end marker is forced then).
    split_reasoning: bool = False
    thinking_budget: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = tuple(self.stop_token_ids or ())
        self.structured_outputs = from_vllm(self.structured_outputs)
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        """Raise ValueError (a ValidationError) naming the parameter, the rule and the value: the engine's
        envelope of every dialect's ranges (params.table.ENGINE)."""
        for f in fields(self):
            rule = ENGINE.get(f.name)
            value = getattr(self, f.name)
            if rule is not None and value is not None:
                setattr(self, f.name, rule.rule.checked(value, f.name))
        check(isinstance(self.logit_bias, dict) and len(self.logit_bias) <= MAX_LOGIT_BIAS, "logit_bias",
              f"an object of at most {MAX_LOGIT_BIAS} token ids", len(self.logit_bias))
        for tid, bias in self.logit_bias.items():
            TOKEN_ID.checked(tid, "logit_bias key")
            LOGIT_BIAS.checked(bias, f"logit_bias[{tid}]")
        check(len(self.stop) <= MAX_STOP_STRINGS, "stop", f"at most {MAX_STOP_STRINGS} strings", len(self.stop))
        for s in self.stop:
            check(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LEN, "stop",
                  f"a list of non-empty strings of at most {MAX_STOP_LEN} characters", s)
        check(len(self.stop_token_ids) <= MAX_STOP_STRINGS, "stop_token_ids",
              f"at most {MAX_STOP_STRINGS} token ids", len(self.stop_token_ids))
        for tid in self.stop_token_ids:
            TOKEN_ID.checked(tid, "stop_token_ids")
        check(isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens, "min_tokens",
              f"an integer from 0 to max_tokens ({self.max_tokens})", self.min_tokens)
        check(self.thinking_budget is None or (isinstance(self.thinking_budget, int) and not isinstance(
            self.thinking_budget, bool) and 0 <= self.thinking_budget <= INT32_MAX), "thinking_budget",
            f"an integer from 0 to {INT32_MAX}", self.thinking_budget)
        check(self.thinking_budget is None or self.num_beams == 1, "thinking_budget",
              "absent with beam search (num_beams > 1)", self.thinking_budget)
        if self.structured_outputs is not None:
            check(self.num_beams == 1, "num_beams", "1 with structured output (beam search under a grammar is not "
                  "supported)", self.num_beams)
            check(not self.ignore_eos, "ignore_eos", "false with structured output (the grammar decides the end)",
                  self.ignore_eos)
        if self.num_beams > 1:
            check(self.greedy, "num_beams", "1 when sampling (temperature > 0): beam sampling is not supported",
                  self.num_beams)
