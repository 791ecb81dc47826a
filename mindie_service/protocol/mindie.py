"""POST / (MindIE's text and stream inference contract) and TGI 1.1's /generate*: their shared body
``{"inputs", "parameters"}`` -> a GenerationRequest, and POST /v1/tokenizer.

The fields and their ranges are the rule table's (``params.table.MINDIE`` and ``.TGI``: they differ only
where the two contracts do); what is left here is the prompt and the rules that join fields."""
from __future__ import annotations

from typing import Any, Literal

from mindie_service.errors import ValidationError, check
from mindie_service.inputs.types import PartsPrompt, TextPrompt
from mindie_service.params.adapter_name import check_adapter_id
from mindie_service.params.priority import Scale, read_rank
from mindie_service.params.ranges import Range, closed
from mindie_service.params.rule import Field, FieldTable, Rule, read_fields
from mindie_service.params.structured_field import read_structured
from mindie_service.params.table import MAX_BEST_OF, MAX_TOP_LOGPROBS, MINDIE, TGI
from mindie_service.protocol.request import GenerationRequest, ProtocolLimits
from mindie_service.protocol.validation import get_str, get_str_list, refuse_unknown, require_object
from mindie_service.sampling_params import MAX_STOP_LEN, SamplingParams
from multimodal import MediaItem, MediaPolicy, TextPart, parse_parts

Dialect = Literal["mindie", "tgi"]
_TABLES: dict[Dialect, FieldTable] = {"mindie": MINDIE, "tgi": TGI}
_STREAM: FieldTable = {"stream": Field("stream", Rule("bool"))}
# POST /'s parameters beside the rule table's: the ones read on their own (MindIE.md's list, plus grammar and
# priority: the latter only where the dialect has a priority scale); any other key is refused by name (no
# contract here has a key that may be ignored).
_OWN_KEYS = frozenset({"stop", "adapter_id", "grammar"})
BODY_KEYS = frozenset({"inputs", "parameters", "stream"})  # POST /'s and TGI's top level (keep_alive taken before)


def _prompt(body: dict[str, Any], limits: ProtocolLimits) -> TextPrompt | PartsPrompt:
    """``inputs`` -> a prompt. A string, or MindIE's list of text/image_url/video_url/audio_url parts;
    a list with media stays parts (fetched and decoded later, off the parser), a list of text parts
    alone is their text joined."""
    v = body.get("inputs")
    if v is None:
        raise ValidationError("Parameter inputs is required, got none")
    if isinstance(v, list):
        parts = parse_parts(v, limits.media_policy or MediaPolicy())
        text = "\n".join(p.text for p in parts if isinstance(p, TextPart))
        if not any(isinstance(p, MediaItem) for p in parts):
            check(len(text) > 0, "inputs", "a list holding at least one non-empty text part", v)
            return TextPrompt(text)
        return PartsPrompt(tuple(parts), text)
    check(isinstance(v, str), "inputs", "a string or a list of parts", v)
    check(len(v) > 0, "inputs", "a non-empty string", v)
    return TextPrompt(v)


def _table(dialect: Dialect, limits: ProtocolLimits) -> FieldTable:
    """The dialect's table, with the deployment's caps on best_of and top_n_tokens where they differ."""
    table = _TABLES[dialect]
    if (limits.max_best_of, limits.max_top_n_tokens) == (MAX_BEST_OF, MAX_TOP_LOGPROBS):
        return table
    return {**table, "best_of": Field("best_of", Rule("int", Range(0, limits.max_best_of))),
            "top_n_tokens": Field("logprobs", Rule("int", closed(0, limits.max_top_n_tokens)))}


def _sampling(v: dict[str, Any]) -> bool:
    """TGI's rule (MindIE: "decided by the other parameters" when do_sample is absent): sample when asked
    or when any warper is set to a non-neutral value."""
    t, p, typ = v.get("temperature"), v.get("top_p"), v.get("typical_p")
    warpers = ((t is not None and t != 1.0) or v.get("top_k") is not None
               or (p is not None and p < 1.0) or (typ is not None and typ < 1.0))
    return bool(v.get("do_sample")) or warpers


def _check_joins(v: dict[str, Any], p: dict[str, Any], stream: bool, sampling: bool) -> None:
    """The rules that join fields (the table checks each alone)."""
    check(not (stream and v.get("decoder_input_details")), "decoder_input_details", "false when stream is true", True)
    # MindIE documents watermark as unsupported; TGI's green-list watermark is not implemented either.
    check(not v.get("watermark"), "watermark", "false (watermarking is not supported)", True)
    best_of = v.get("best_of", 1)
    if best_of > 1:
        check(not stream, "best_of", "1 when stream is true", best_of)
        check(v.get("seed") is None, "best_of", "1 when a seed is given", best_of)
        check(sampling, "best_of", "1 unless sampling (do_sample or a temperature/top_k/top_p/typical_p)", best_of)


def parse_generation(body: dict[str, Any], *, dialect: Dialect, stream: bool, limits: ProtocolLimits,
                     priority: Scale | None = None, extra_keys: frozenset[str] | None = None) -> GenerationRequest:
    """Validate ``body`` (``inputs`` + ``parameters``); raise ValidationError on bad input. ``priority``: the
    scale ``parameters.priority`` is read on (params.priority; None: the dialect has none). ``extra_keys``:
    refuse any parameter but the table's, POST /'s own and these (None: leave other keys to the caller)."""
    prompt = _prompt(body, limits)
    p = require_object(body.get("parameters"), "parameters")
    if extra_keys is not None:
        own = _OWN_KEYS | ({"priority"} if priority is not None else set())
        refuse_unknown(p, frozenset(_table(dialect, limits)) | own | extra_keys, "parameters.")
    v = read_fields(p, _table(dialect, limits))
    stop = get_str_list(p, "stop", limits.max_stop_sequences, MAX_STOP_LEN)
    adapter = check_adapter_id(get_str(p, "adapter_id", None))
    sampling = _sampling(v)
    _check_joins(v, p, stream, sampling)
    top_k = v.get("top_k")
    if top_k is not None and top_k >= limits.vocab_size:
        top_k = None  # MindIE: top_k >= vocab size means the whole vocabulary
    details, decoder_input_details = v.get("details", False), v.get("decoder_input_details", False)
    params = SamplingParams(
        max_tokens=v.get("max_tokens", 20),
        temperature=v.get("temperature", 1.0) if sampling else 0.0,
        top_k=(top_k or 0) if sampling else 0,
        top_p=v.get("top_p", 1.0) if sampling else 1.0,
        typical_p=v.get("typical_p", 1.0) if sampling else 1.0,
        repetition_penalty=v.get("repetition_penalty", 1.0),
        frequency_penalty=v.get("frequency_penalty", 0.0),
        seed=v.get("seed"), stop=stop, logprobs=v.get("logprobs") or None,
        prompt_logprobs=decoder_input_details or (dialect == "mindie" and details),
        adapter_id=adapter, structured_outputs=read_structured(p, dialect),
        thinking_budget=v.get("thinking_budget"),  # the text stays whole (markers included): no split here
    )
    return GenerationRequest(
        prompt=prompt, params=params, truncate=v.get("truncate"), stream=stream,
        details=details or decoder_input_details, decoder_input_details=decoder_input_details,
        return_full_text=v.get("return_full_text", False), best_of=v.get("best_of", 1),
        top_n_tokens=v.get("logprobs", 0), sampling=sampling,
        rank=read_rank(p, priority) if priority is not None else 0,
    )


def parse_mindie_request(body: dict[str, Any], limits: ProtocolLimits,
                         extra_keys: frozenset[str] = frozenset()) -> GenerationRequest:
    """``{"inputs", "parameters"?, "stream"?}`` -> GenerationRequest (stream absent or null = false); a
    parameter that is neither POST /'s nor in ``extra_keys`` (a route's own, read by its caller) is refused, and
    so is any top-level key but ``inputs``, ``parameters`` and ``stream``."""
    refuse_unknown(body, BODY_KEYS)
    stream = bool(read_fields(body, _STREAM).get("stream", False))
    return parse_generation(body, dialect="mindie", stream=stream, limits=limits, priority="mindie",
                            extra_keys=extra_keys)


def parse_tokenizer_request(body: dict[str, Any]) -> str:
    """POST /v1/tokenizer: ``{"inputs": "..."}`` -> the text to tokenize (any other key is refused by name;
    ``keep_alive`` was taken before)."""
    refuse_unknown(body, {"inputs"})
    v = body.get("inputs")
    check(isinstance(v, str) and len(v) > 0, "inputs", "a non-empty string", v)
    return v
