"""The rule table: one rule per request parameter, and each API dialect's spelling of it.

A dialect declares its fields as ``{field as it spells it: Field(neutral name, rule)}``; ``read_fields``
checks them all the same way. Where a dialect's documented range differs from another's, its entry
says so on one line (``# MindIE: ...``). ``ENGINE`` is the envelope every dialect's range lies inside:
SamplingParams (the offline API and the engine contract) checks it."""
from __future__ import annotations

from types import MappingProxyType

from mindie_service.params.ranges import INT32_MAX, UINT64_MAX, Range, closed
from mindie_service.params.rule import Field, FieldTable, Rule

MAX_STOP_STRINGS = 32
MAX_STOP_LEN = 1024
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # OpenAI's cap on logit_bias entries
MAX_BEAMS = 8
MAX_BEST_OF = 4  # TGI/MindIE best_of
MAX_N = 16  # OpenAI choices per prompt
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's cap on completions' logprobs (vLLM's too)
MAX_GENERATIONS = 16  # batch jobs' num_generations

# The rules the dialects share (the same decision and the same words wherever the parameter is spelled).
MAX_TOKENS = Rule("int", Range(0, INT32_MAX))
REPETITION_PENALTY = Rule("float", Range(0.0))
PENALTY = Rule("float", closed(-2.0, 2.0))  # frequency_penalty, presence_penalty (OpenAI's range)
TOP_P = Rule("float", Range(0.0, 1.0))
BOOL = Rule("bool")
LOGIT_BIAS = Rule("float", closed(-100.0, 100.0))  # one entry of OpenAI's logit_bias (its range)
TOKEN_ID = Rule("int", closed(0, INT32_MAX))
POSITIVE_INT32 = Rule("int", Range(0, INT32_MAX))


def _table(**fields: Field | Rule) -> FieldTable:
    """A dialect's table; a bare Rule sets the parameter of the same name."""
    return MappingProxyType({k: (v if isinstance(v, Field) else Field(k, v)) for k, v in fields.items()})


# The engine's envelope (SamplingParams' own field names: the offline API).
ENGINE = _table(
    max_tokens=MAX_TOKENS,
    temperature=Rule("float", closed(0.0)),  # 0 = greedy
    top_k=Rule("int"),  # <= 0: off
    top_p=TOP_P, typical_p=TOP_P, repetition_penalty=REPETITION_PENALTY,
    min_p=Rule("float", closed(0.0, 1.0)),
    frequency_penalty=PENALTY, presence_penalty=PENALTY,
    seed=Rule("int", closed(0, UINT64_MAX)),
    logprobs=Rule("int", closed(0, MAX_TOP_LOGPROBS)),
    num_beams=Rule("int", closed(1, MAX_BEAMS)),
    length_penalty=Rule("float"),
    early_stopping=Rule("early_stopping"),
)

# MindIE's POST / ``parameters`` (MindIE's documented ranges).
MINDIE = _table(
    details=BOOL, decoder_input_details=BOOL, do_sample=BOOL,
    max_new_tokens=Field("max_tokens", MAX_TOKENS),
    repetition_penalty=REPETITION_PENALTY,
    frequency_penalty=PENALTY,
    return_full_text=BOOL,
    seed=Rule("int", Range(0, UINT64_MAX)),  # MindIE/TGI: > 0 (OpenAI, HF, offline: >= 0)
    temperature=Rule("float", Range(1e-6)),  # MindIE: > 1e-6 (TGI: > 0; OpenAI: [0, 2])
    top_k=POSITIVE_INT32,
    top_p=Rule("float", Range(1e-6, 1.0, hi_open=True)),  # MindIE: (1e-6, 1) (TGI, OpenAI, HF: (0, 1])
    truncate=POSITIVE_INT32,
    typical_p=TOP_P,
    watermark=BOOL,
    best_of=Rule("int", Range(0, MAX_BEST_OF)),
    top_n_tokens=Field("logprobs", Rule("int", closed(0, MAX_TOP_LOGPROBS))),
    thinking_budget=Rule("int", closed(0, INT32_MAX)),  # thinking tokens before </think> (engine.output.reasoning)
)

# TGI 1.1's GenerateParameters: MindIE's table but for TGI's documented ranges.
TGI = _table(**{**MINDIE,
                "temperature": Rule("float", Range(0.0)),  # TGI: > 0
                "top_p": TOP_P})  # TGI: (0, 1]

# OpenAI's /v1/completions and /v1/chat/completions (OpenAI's documented ranges).
_OPENAI = dict(
    stream=BOOL,
    n=Rule("int", closed(1, MAX_N)),
    max_tokens=MAX_TOKENS,  # OpenAI: an integer >= 1 (the same decision as (0, INT32_MAX])
    temperature=Rule("float", closed(0.0, 2.0)),  # OpenAI: [0, 2], 0 = greedy
    top_p=TOP_P,
    seed=Rule("int", closed(0, UINT64_MAX)),
    frequency_penalty=PENALTY, presence_penalty=PENALTY,
)
OPENAI_COMPLETION = _table(**_OPENAI, echo=BOOL,
                           logprobs=Rule("int", closed(0, MAX_COMPLETION_LOGPROBS)),
                           best_of=Rule("int", closed(1, MAX_N)))
OPENAI_CHAT = _table(**_OPENAI, max_completion_tokens=Field("max_tokens", MAX_TOKENS),
                     logprobs=Field("want_logprobs", BOOL),
                     top_logprobs=Field("logprobs", Rule("int", closed(0, MAX_TOP_LOGPROBS))))
# Anthropic's /v1/messages (Anthropic's documented ranges; top_p and top_k come through the SDK's extra_body).
ANTHROPIC = _table(max_tokens=MAX_TOKENS, stream=BOOL,
                   temperature=Rule("float", closed(0.0, 1.0)),  # Anthropic: [0, 1], 0 = greedy
                   top_p=TOP_P, top_k=Rule("int", closed(0, INT32_MAX)))  # top_k 0: off
# vLLM's extra sampling fields on the OpenAI routes (protocol.vllm_fields: the rest of them).
VLLM = _table(top_k=Rule("int", closed(-1, INT32_MAX)),  # vLLM: -1 = off
              repetition_penalty=REPETITION_PENALTY, ignore_eos=BOOL,
              min_tokens=Rule("int", closed(0, INT32_MAX)),
              min_p=Rule("float", closed(0.0, 1.0)))  # vLLM: [0, 1], 0 = off

# HF generate's generation_config (the seed REST API /api/*; also GenerationDefaults and MINDIE_GEN_*).
HF = _table(
    num_beams=Rule("int", closed(1, MAX_BEAMS), text=f"an integer in [1, {MAX_BEAMS}]", integral_float=True),
    do_sample=BOOL,
    temperature=Rule("float", closed(0.0)),  # HF: >= 0 (> 0 when do_sample)
    top_p=TOP_P,
    top_k=Rule("int", closed(0, INT32_MAX), integral_float=True),  # HF: 0 = off
    max_new_tokens=Rule("int", MAX_TOKENS.range, integral_float=True),  # GenerationConfig keeps HF's names
    repetition_penalty=REPETITION_PENALTY,
    length_penalty=Rule("float", text="a finite number"),
    early_stopping=Rule("early_stopping"),
)

# The seed REST API's own switches (/api/generate-one, /api/generate-batch).
REST = _table(only_new_tokens=BOOL, stream_response=BOOL)

# A batch job's ``options`` (llama-stack's SamplingParams subset; OpenAI's ranges).
JOB_OPTIONS = _table(
    max_tokens=MAX_TOKENS,
    temperature=Rule("float", closed(0.0, 2.0)),  # jobs: [0, 2], 0 = greedy (OpenAI's)
    top_p=TOP_P,
    logprobs=BOOL,
)
JOB = _table(num_generations=Rule("int", closed(1, MAX_GENERATIONS)))

# Structured output (mindie_service.structured.request_forms): the field each dialect spells it with, and its form.
STRUCTURED = MappingProxyType({
    "openai": ("response_format", "response_format"),  # also TGI's chat form {"type": "json", "value": schema}
    "vllm": ("structured_outputs", "vllm"),  # also guided_json / _regex / _choice / _grammar
    "tgi": ("grammar", "tgi_grammar"),  # parameters.grammar (TGI 1.4's shape; an extension of the 1.1 document)
    "mindie": ("grammar", "tgi_grammar"),
    "job": ("response_format", "response_format"),  # a batch job's options, applied to every line
})
