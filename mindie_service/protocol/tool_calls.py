"""Tools on /v1/chat/completions: ``tools``, ``tool_choice`` (none | auto | required | a named function),
``parallel_tool_calls``, and the history messages that carry calls (assistant ``tool_calls``) and their results
(``role: "tool"``, ``tool_call_id``) -> a ``ToolsRequest``: what the chat renderer shows the model and the
grammar that enforces the call (structured.tool_formats).

``required`` and a named function are enforced (a call always comes, its arguments match the function's
schema); ``auto`` lets the model answer in text or call (a lazy grammar: free text until the call marker, then
the call is enforced); ``none`` renders no tools and allows no call."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mindie_service.errors import ValidationError, check
from mindie_service.structured.request_forms import NAME_RE
from mindie_service.structured.grammar_spec import StructuredSpec
from mindie_service.structured.schema_refs import check_refs
from mindie_service.structured.tool_formats import ToolFormat

MAX_TOOLS = 128
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolsRequest:
    tools: tuple[dict[str, Any], ...]  # [{"type": "function", "function": {name, description?, parameters}}]
    choice: str  # none | auto | required | the named function's name
    parallel: bool
    fmt: ToolFormat
    legacy: bool = False  # sent as functions / function_call: answered as message.function_call

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    @property
    def named(self) -> bool:
        return self.choice not in CHOICES

    def spec(self, answer: StructuredSpec | None = None) -> StructuredSpec | None:
        """The grammar enforcing the calls; ``answer`` (response_format's JSON spec): what a reply that is not a
        call must match (tool_choice auto; a required call leaves no room for another answer)."""
        if not self.active:
            return None
        if answer is not None and answer.kind != "json":
            raise ValidationError(f"Parameter {answer.where} must be a JSON format (json_object or json_schema) "
                                  f"when tools are given, got a {answer.kind} format")
        used = [(i, t) for i, t in enumerate(self.tools) if not self.named or t["function"]["name"] == self.choice]
        tools = [t for _, t in used]
        required = self.named or self.choice == "required"
        text = self.fmt.grammar(tools, required=required, parallel=self.parallel and not self.named,
                                answer=None if answer is None or required else answer.source)
        parts = tuple((f"tools[{i}].function.parameters", json.dumps(t["function"]["parameters"], ensure_ascii=False))
                      for i, t in used)
        return StructuredSpec("grammar", text, "tools", keep_special=self.fmt.keep_special, parts=parts)


def _tool(t: Any, where: str) -> dict[str, Any]:
    check(isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict), where,
          'an object {"type": "function", "function": {"name", "description"?, "parameters"?}}', t)
    f = t["function"]
    extra = sorted(set(f) - {"name", "description", "parameters", "strict"})
    check(not extra, f"{where}.function", "an object of name, description, parameters, strict", extra)
    check(isinstance(f.get("name"), str) and NAME_RE.match(f["name"]) is not None, f"{where}.function.name",
          "a string of 1 to 64 letters, digits, _ or -", f.get("name"))
    check(f.get("description") is None or isinstance(f["description"], str), f"{where}.function.description",
          "a string", f.get("description"))
    params = f.get("parameters", {"type": "object", "properties": {}})
    check(isinstance(params, dict), f"{where}.function.parameters", "a JSON Schema object", params)
    check_refs(params, f"{where}.function.parameters")
    out = {"name": f["name"], "parameters": params}
    if f.get("description"):
        out["description"] = f["description"]
    return {"type": "function", "function": out}


def _choice(v: Any, names: list[str]) -> str:
    if v is None:
        return "auto" if names else "none"
    if isinstance(v, str):
        check(v in CHOICES, "tool_choice", 'none, auto, required or {"type": "function", "function": {"name"}}', v)
        check(v == "none" or bool(names), "tool_choice", "none or absent when no tools are given", v)
        return v
    check(isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("function"), dict)
          and isinstance(v["function"].get("name"), str), "tool_choice",
          'none, auto, required or {"type": "function", "function": {"name"}}', v)
    name = v["function"]["name"]
    check(name in names, "tool_choice.function.name", f"one of the tools ({', '.join(names) or 'none given'})", name)
    return name


def parse_tools(body: dict[str, Any], fmt: ToolFormat, legacy: bool = False) -> ToolsRequest | None:
    """``tools`` / ``tool_choice`` / ``parallel_tool_calls`` (None when the request has none of them)."""
    raw, choice, par = body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls")
    if raw is None and choice is None and par is None:
        return None
    raw = [] if raw is None else raw
    check(isinstance(raw, list) and len(raw) <= MAX_TOOLS, "tools", f"a list of at most {MAX_TOOLS} tools",
          raw if not isinstance(raw, list) else len(raw))
    tools = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(raw))
    names = [t["function"]["name"] for t in tools]
    dup = sorted({n for n in names if names.count(n) > 1})
    check(not dup, "tools", "functions of distinct names", dup)
    check(par is None or isinstance(par, bool), "parallel_tool_calls", "a boolean", par)
    return ToolsRequest(tools, _choice(choice, names), True if par is None else par, fmt, legacy)


def message_tool_fields(m: dict[str, Any], where: str, role: str) -> tuple[tuple[tuple[str, str, str], ...], str | None]:
    """An assistant message's ``tool_calls`` ((id, name, arguments JSON text) each) and a tool message's
    ``tool_call_id``."""
    calls: list[tuple[str, str, str]] = []
    raw = m.get("tool_calls")
    if raw is not None:
        check(role == "assistant" and isinstance(raw, list), f"{where}.tool_calls", "a list, on assistant messages",
              raw)
        for j, c in enumerate(raw):
            at = f"{where}.tool_calls[{j}]"
            f = c.get("function") if isinstance(c, dict) else None
            check(isinstance(f, dict) and isinstance(f.get("name"), str), at,
                  'an object {"id", "type": "function", "function": {"name", "arguments"}}', c)
            args = f.get("arguments", "{}")
            if not isinstance(args, str):
                args = json.dumps(args, ensure_ascii=False)
            calls.append((str(c.get("id", f"call_{j}")), f["name"], args))
    tid = m.get("tool_call_id")
    if role == "tool":
        check(isinstance(tid, str) and tid != "", f"{where}.tool_call_id", "the id of the call this answers", tid)
    elif tid is not None:
        raise ValidationError(f"Parameter {where}.tool_call_id must be absent unless role is tool, got {tid!r}")
    return tuple(calls), tid
