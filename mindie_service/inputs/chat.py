"""Chat messages -> prompt token ids: the tokenizer's chat template, or role prefixes for a checkpoint
without one (Jan's model.json ``engine_parameters.system_prompt`` / ``user_prompt`` / ``ai_prompt``).

Used by the input processor for ``ChatPrompt`` (the OpenAI chat route) and by batch jobs. Multimodal
checkpoints render through their processor (``MediaEncoder.prepare_chat``), not here."""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from mindie_service.errors import ContextLengthError, ValidationError
from mindie_service.inputs.text_bound import TextBound, tokenize_bounded
from mindie_service.inputs.types import ChatMessage
from mindie_service.structured.tool_formats import detect, renders_tools

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatPrefixes:
    """Role prefixes for checkpoints without a chat template (Jan's defaults)."""

    system: str = "SYSTEM: "
    user: str = "USER: "
    assistant: str = "ASSISTANT: "

    def of(self, role: str) -> str:
        return {"system": self.system, "user": self.user, "assistant": self.assistant}[role]


def text_content(msg: ChatMessage, index: int) -> str:
    """A message's text: a string as is, text parts joined by newlines; media parts refused (text models)."""
    if isinstance(msg.content, str):
        return msg.content
    texts = []
    for part in msg.content:
        if not isinstance(part, str):
            kind = getattr(part, "kind", type(part).__name__)
            raise ValidationError(f"Parameter messages[{index}].content must hold only text parts "
                                  f"(this model takes no media), got a {kind} part")
        texts.append(part)
    return "\n".join(texts)


def message_chars(messages: Sequence[ChatMessage]) -> int:
    """Characters of the messages' text (strings and text parts; media parts count none)."""
    total = 0
    for m in messages:
        if isinstance(m.content, str):
            total += len(m.content)
            continue
        for part in m.content:
            if isinstance(part, str):
                total += len(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"])
    return total


def check_chat_chars(messages: Sequence[ChatMessage], bound: TextBound | None, limit: int) -> None:
    """Refuse, before rendering or tokenizing, messages whose text alone cannot fit ``limit`` tokens: the
    rendered prompt holds every message's text, and no token stands for more than ``max_token_chars``
    characters (text_bound.py), so over ``limit x max_token_chars`` characters it is over ``limit`` tokens."""
    if bound is None:
        return
    over, chars = bound.refuse_over(limit), message_chars(messages)
    if chars > over:
        raise ContextLengthError(f"Parameter messages must be at most {limit} tokens (maxInputTokenLen, "
                                 f"maxSeqLen - 1 and the KV pool bound it), got messages of {chars} characters "
                                 f"(more than {over} characters cannot fit in {limit} tokens of this tokenizer)")


def _args_value(arguments: str) -> Any:
    """A call's arguments as templates take them (an object); text that is not JSON stays text."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def chat_dicts(messages: Sequence[ChatMessage], tools: Sequence[Any], fmt: Any, native: bool) -> list[dict[str, Any]]:
    """Messages as a chat template takes them. ``native``: the template renders tools, calls and tool results
    itself; else calls are written in ``fmt``'s words, tool results become user turns in <tool_response>, and the
    tools go into the system message."""
    fmt = fmt or detect(None)
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        content = text_content(m, i)
        d: dict[str, Any] = {"role": m.role, "content": content}
        if native:
            if m.tool_calls:
                d["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": n, "arguments": _args_value(a)}}
                                   for cid, n, a in m.tool_calls]
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
        elif m.role == "tool":
            d = {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
        elif m.tool_calls:
            d["content"] = content + fmt.call_text([(n, a) for _, n, a in m.tool_calls])
        out.append(d)
    if tools and not native:
        sys = fmt.system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + sys}
        else:
            out.insert(0, {"role": "system", "content": sys})
    return out


class ChatRenderer:
    """Renders messages for one text model. ``tokenizer``: a Hugging Face tokenizer (its ``chat_template``, if
    any, is used and the rendered text is encoded without adding special tokens: the template writes them);
    ``tokenize``: the processor's plain tokenizer, used for the prefix form (it adds special tokens as for
    any text prompt)."""

    def __init__(self, tokenizer: Any = None, prefixes: ChatPrefixes = ChatPrefixes()) -> None:
        self.tokenizer = tokenizer
        self.prefixes = prefixes
        self.has_template = bool(getattr(tokenizer, "chat_template", None))

    def render(self, messages: Sequence[ChatMessage], tools: Sequence[Any] = (), fmt: Any = None, *,
               add_generation_prompt: bool = True, template_kwargs: Sequence[tuple[str, Any]] = ()) -> str:
        """The prompt text, ending with the assistant's generation prompt (unless ``add_generation_prompt`` is
        false: vLLM's /tokenize may ask for the conversation alone). ``tools`` (OpenAI's function tools) are
        rendered by the chat template where it renders them, else put in the system message in ``fmt``'s
        documented words (structured.tool_formats). ``template_kwargs``: extra template variables (vLLM's
        chat_template_kwargs, e.g. Qwen3's enable_thinking); without a chat template they are refused."""
        if not messages:
            raise ValidationError("Parameter messages must be a non-empty list, got []")
        native = self.has_template and renders_tools(self.tokenizer.chat_template)
        plain = chat_dicts(messages, tools, fmt, native)
        if self.has_template:
            try:
                return str(self.tokenizer.apply_chat_template(plain, tools=list(tools) if native and tools else None,
                                                              tokenize=False,
                                                              add_generation_prompt=add_generation_prompt,
                                                              **dict(template_kwargs)))
            except ValidationError:
                raise
            except Exception as e:  # a template that raises (e.g. roles must alternate) is the caller's input
                raise ValidationError(f"Parameter messages must fit the model's chat template: "
                                      f"{type(e).__name__}: {e}") from None
        if template_kwargs:
            raise ValidationError("Parameter chat_template_kwargs must be absent: this model has no chat template "
                                  "(its turns are written with model.json's role prefixes)")
        out = [self.prefixes.of(m["role"]) + m["content"] + "\n" for m in plain]
        return "".join(out) + (self.prefixes.assistant if add_generation_prompt else "")

    def encode(self, messages: Sequence[ChatMessage], tokenize: Callable[[str], list[int]], *,
               bound: TextBound | None = None, keep: int | None = None, limit: int | None = None,
               tools: Sequence[Any] = (), fmt: Any = None,
               template_kwargs: Sequence[tuple[str, Any]] = ()) -> list[int]:
        """The prompt's ids. Given the length rule (``limit``; ``keep``: the trailing tokens a cut keeps, None
        when an over-long prompt is refused), as the text path does: messages that cannot fit are refused
        before rendering, and a prompt that will be cut has only its tail tokenized."""
        if bound is not None and limit is not None and keep is None:
            check_chat_chars(messages, bound, limit)
        text = self.render(messages, tools, fmt, template_kwargs=template_kwargs)
        if self.has_template:  # the template writes the special tokens: none are added, none to strip
            def encode(t: str) -> list[int]:
                return list(self.tokenizer(t, add_special_tokens=False).input_ids)
            bound = dataclasses.replace(bound, specials=()) if bound is not None else None
        else:
            encode = tokenize
        if bound is None or limit is None:
            return encode(text)
        return tokenize_bounded(encode, text, bound, keep=keep, limit=limit)
