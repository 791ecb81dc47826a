"""Tool-call formats, one per model family (vLLM's ``--tool-call-parser`` names): how a model is told about
its tools when its chat template does not render them, how it writes a call, and the grammars that enforce a
call (``tool_choice`` required or a named function: always; ``auto``: lazily, once the call marker appears).

    hermes       Hermes / Qwen2.5: <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, one per call
    llama3_json  Llama 3.1-3.3 JSON: <|python_tag|>? {"name": ..., "parameters": {...}}; calls joined by "; "
    mistral      Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]

A format is chosen from the model's chat template (``detect``), or named by the config key
``ModelDeployConfig.structuredOutput.toolCallParser``. A call's arguments hold the function's declared
parameters only (objects listing properties admit no others unless they say so). Plain data and text: no
grammar library here.

Where the model's tokenizer holds the call marker as one special token (Mistral's ``[TOOL_CALLS]``, Llama
3.x's ``<|python_tag|>``), ``for_tokenizer`` binds its id: the grammars then name that token (llguidance's
``<[id]>``), so the model's own marker token is the one allowed (forced where the call is required), not the
marker spelled out in ordinary tokens; the detokenizer keeps the marker's text in that request's output
(``StructuredSpec.keep_special``) so the parser sees where the calls begin. Without such a token the
grammars spell the marker as text."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Sequence

from mindie_service.errors import ValidationError
from mindie_service.structured.grammar_spec import closed_objects
from mindie_service.structured.schema_refs import has_refs, reroot

MAX_PARALLEL_CALLS = 16  # calls in one reply (parallel_tool_calls): a grammar that always ends


@dataclass(frozen=True)
class ToolFormat:
    name: str
    open: str  # the call marker: where the calls begin
    args_key: str  # "arguments" or "parameters"
    list_open: str = ""  # after the marker, before the first call ("[" for mistral)
    sep: str = ""  # between calls of one group ("," mistral, "; " llama3_json)
    close: str = ""  # after each call (hermes) or after the group (mistral); "" : the text ends there
    per_call_wrap: bool = False  # marker and close around every call (hermes), else around the group
    bare_json: bool = False  # a reply that starts with "{" is a call even without the marker (llama3_json)
    open_id: int | None = None  # the marker's special token id in the model's tokenizer (None: spelled as text)

    # -- rendering ---------------------------------------------------------------------------------
    def call_text(self, calls: Sequence[tuple[str, str]]) -> str:
        """The text of ``calls`` ((name, arguments JSON text)) as the model writes them."""
        bodies = ['{"name":%s,"%s":%s}' % (json.dumps(n, ensure_ascii=False), self.args_key, a or "{}")
                  for n, a in calls]
        if self.per_call_wrap:
            return "".join(f"{self.open}\n{b}\n{self.close}" for b in bodies)
        return f"{self.open}{self.list_open}{self.sep.join(bodies)}{self.close}"

    def system_prompt(self, tools: Sequence[dict[str, Any]]) -> str:
        """The tools' schemas and the call format, in the family's documented words (for a chat template
        that does not render tools itself)."""
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        example = self.call_text([("<function-name>", "<args-json-object>")])
        return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listing}\n"
                f"</tools>\n\nFor each function call, return a json object with function name and {self.args_key} "
                f"like this:\n{example}")

    # -- grammars (llguidance's Lark dialect, %json for the bodies) -----------------------------------
    def _body(self, tools: Sequence[dict[str, Any]]) -> str:
        """Rule ``body``: one call object per tool. Each tool's parameters sit under the wrapper's arguments key;
        a schema with local references is moved to the wrapper's ``$defs`` with its references re-rooted
        (structured.schema_refs), so ``#/$defs/X`` and recursive ``#`` still mean what they meant."""
        defs: dict[str, Any] = {}
        variants = []
        for i, t in enumerate(tools):
            params = closed_objects(t["function"].get("parameters") or {"type": "object"})
            if has_refs(params):
                defs[f"tool{i}"] = reroot(params, f"tool{i}")
                params = {"$ref": f"#/$defs/tool{i}"}
            variants.append({"type": "object", "additionalProperties": False, "required": ["name", self.args_key],
                             "properties": {"name": {"const": t["function"]["name"]}, self.args_key: params}})
        schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
        if defs:
            schema["$defs"] = defs
        schema["x-guidance"] = {"whitespace_flexible": False}
        return "body: %json " + json.dumps(schema, ensure_ascii=False)

    @property
    def keep_special(self) -> tuple[int, ...]:
        """Special tokens whose text a call request's output keeps (the bound marker)."""
        return () if self.open_id is None else (self.open_id,)

    def _lead(self, text: str) -> str:
        """The marker then ``text`` as grammar items: the marker's special token by id, else one literal."""
        if self.open_id is None:
            return json.dumps(self.open + text)
        return f"<[{self.open_id}]>" + (f" {json.dumps(text)}" if text else "")

    def _calls(self, parallel: bool) -> list[str]:
        """Rules ``calls`` (one group of calls, marker included) and ``call``."""
        more = "{0,%d}" % (MAX_PARALLEL_CALLS - 1) if parallel else ""
        if self.per_call_wrap:
            return [f"calls: call{'{1,%d}' % MAX_PARALLEL_CALLS if parallel else ''}",
                    f"call: {self._lead(chr(10))} body {json.dumps(chr(10) + self.close)}"]
        tail = f" {json.dumps(self.close)}" if self.close else ""
        if not self.bare_json:
            lead = self._lead(self.list_open)
        else:  # llama3_json needs no marker; its special token, where the tokenizer has one, may lead
            lead = json.dumps(self.list_open) if self.open_id is None else f"<[{self.open_id}]>?"
        return [f"calls: {lead} body ({json.dumps(self.sep)} body){more}{tail}" if self.sep else
                f"calls: {lead} body{tail}"]

    def grammar(self, tools: Sequence[dict[str, Any]], *, required: bool, parallel: bool,
                answer: str | None = None) -> str:
        """A call is required (tool_choice required, or ``tools`` holding only the named function), or the model
        may answer in text (auto): then the grammar is lazy, free text until the call marker appears, and the
        call(s) end the reply. ``answer`` (a JSON Schema's text: the request's response_format): an answer that
        is not a call follows it (no free text then: the reply is that JSON, or the calls)."""
        body = self._body(tools)
        if required:
            return "\n".join(["start: calls", *self._calls(parallel), body])
        nl = chr(10)
        if answer is not None:
            schema = json.loads(answer)
            schema["x-guidance"] = {"whitespace_flexible": False}
            return nl.join(["start: answer | calls", *self._calls(parallel), body,
                            "answer: %json " + json.dumps(schema, ensure_ascii=False)])
        if self.per_call_wrap:
            rest = f"rest: {json.dumps(nl)} body {json.dumps(nl + self.close)}"
            start = f"start: TEXT | (hd rest){'{1,%d}' % MAX_PARALLEL_CALLS if parallel else ''}"
        elif self.bare_json:  # text that does not start with "{", or the calls
            return nl.join(["start: TEXT | calls", "TEXT: /[^{](.|\\n)*/", *self._calls(parallel), body])
        else:
            more = f" ({json.dumps(self.sep)} body){{0,{MAX_PARALLEL_CALLS - 1}}}" if self.sep and parallel else ""
            rest = f"rest: {json.dumps(self.list_open)} body{more}" + (f" {json.dumps(self.close)}" if self.close else "")
            start = "start: TEXT | hd rest"
        # a special marker cannot occur inside TEXT: the text then the token, no lazy lexeme needed
        hd = f"hd: TEXT? {self._lead('')}" if self.open_id is not None else f"hd[lazy]: TEXT {self._lead('')}"
        return nl.join([start, "TEXT: /(.|\\n)*/", hd, rest, body])


FORMATS: dict[str, ToolFormat] = {f.name: f for f in (
    ToolFormat("hermes", "<tool_call>", "arguments", close="</tool_call>", per_call_wrap=True),
    ToolFormat("llama3_json", "<|python_tag|>", "parameters", sep="; ", bare_json=True),
    ToolFormat("mistral", "[TOOL_CALLS]", "arguments", list_open="[", sep=",", close="]"),
)}
ALIASES = {"qwen": "hermes", "qwen2_5": "hermes", "llama3": "llama3_json", "llama": "llama3_json"}


def get_format(name: str) -> ToolFormat:
    f = FORMATS.get(ALIASES.get(name, name))
    if f is None:
        raise ValidationError(f"toolCallParser must be one of {', '.join(sorted(FORMATS))}, got {name!r}")
    return f


def detect(chat_template: str | None, explicit: str | None = None) -> ToolFormat:
    """The format a config names, else the one the chat template writes, else hermes (whose system-message
    form is then used to tell the model about its tools)."""
    if explicit:
        return get_format(explicit)
    t = chat_template or ""
    if "[TOOL_CALLS]" in t:
        return FORMATS["mistral"]
    if "<|python_tag|>" in t or "ipython" in t:
        return FORMATS["llama3_json"]
    return FORMATS["hermes"]


def special_marker_id(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` when ``tokenizer`` (a Hugging Face tokenizer) holds it as one special token, else None."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    for i, tok in decoder.items():
        if str(getattr(tok, "content", tok)) == text and getattr(tok, "special", False):
            return int(i)
    ids = getattr(tokenizer, "all_special_ids", None) or []
    toks = getattr(tokenizer, "all_special_tokens", None) or []
    return next((int(i) for i, t in zip(ids, toks) if t == text), None)


def for_tokenizer(fmt: ToolFormat, tokenizer: Any) -> ToolFormat:
    """``fmt`` with its marker bound to the tokenizer's special token, where it has one."""
    i = special_marker_id(tokenizer, fmt.open) if tokenizer is not None else None
    return fmt if i == fmt.open_id else replace(fmt, open_id=i)


def renders_tools(chat_template: str | None) -> bool:
    """Whether a chat template renders ``tools`` itself (else they go into the system message)."""
    return bool(chat_template) and "tools" in str(chat_template)
