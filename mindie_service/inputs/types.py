"""What the input processor takes: an API-neutral prompt, and what it needs from a model's media encoder.

Each API family parses its JSON into one of these prompt kinds; the offline API builds them from
Python values. The next kinds (OpenAI chat messages, batch-job messages, a session continuation)
join the ``Prompt`` union and get one branch in ``InputProcessor._prompt_ids``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, Union

from mindie_service.engine.contract import SessionTokens


@dataclass(frozen=True)
class TextPrompt:
    """Plain text, tokenized as is (the tokenizer adds its special tokens)."""

    text: str


@dataclass(frozen=True)
class TokensPrompt:
    """Token ids the caller tokenized (the offline API); checked against the vocabulary."""

    token_ids: tuple[int, ...]
    text: str = ""  # no text: nothing for return_full_text to prepend


@dataclass(frozen=True)
class PartsPrompt:
    """One user message of parts in order, for multimodal models. ``parts`` are either references still to
    fetch (``multimodal.TextPart`` / ``MediaItem``, from MindIE's list-form ``inputs``) or parts the model's
    processor takes as they are (``multimodal.LoadedPart`` or dicts such as ``{"type": "image", "image": pil}``)."""

    parts: tuple[Any, ...]
    text: str = ""  # the text parts joined: what return_full_text prepends


@dataclass(frozen=True)
class ChatMessage:
    """One chat turn. ``content`` is a string, or parts in order: text strings and media references
    (``multimodal.MediaItem``) or loaded media (``multimodal.LoadedPart``) for multimodal models."""

    role: str  # system | user | assistant | tool
    content: str | tuple[Any, ...]
    tool_calls: tuple[tuple[str, str, str], ...] = ()  # an assistant's calls: (id, name, arguments JSON text)
    tool_call_id: str | None = None  # a tool message: the call it answers


@dataclass(frozen=True)
class ChatPrompt:
    """Chat messages, rendered with the model's chat template (or its model.json prefixes) by
    ``inputs.chat``, ending with the assistant's generation prompt."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[Any, ...] = ()  # OpenAI-shaped function tools the model may call (none: none rendered)
    tool_format: Any = None  # structured.tool_formats.ToolFormat of those calls (with tools)
    template_kwargs: tuple[tuple[str, Any], ...] = ()  # extra chat-template variables (vLLM's chat_template_kwargs)

    @property
    def text(self) -> str:  # what return_full_text / echo would prepend: chat never echoes
        return ""


Prompt = Union[TextPrompt, TokensPrompt, PartsPrompt, ChatPrompt]


class MediaPrompt(Protocol):
    """A media encoder's prompt: ids with placeholders expanded, the media tensors, their content hashes."""

    prompt_token_ids: list[int]
    mm_inputs: Any
    mm_hashes: tuple[str, ...]


class MediaEncoder(Protocol):
    """The part of a multimodal model's encoder the input processor uses (models.media_encoders.MultimodalEncoder)."""

    modalities: tuple[str, ...]

    @property
    def sampling_rate(self) -> int | None: ...

    def prepare(self, parts: Sequence[Any]) -> MediaPrompt: ...

    def prepare_chat(self, messages: Sequence[tuple[str, Any]]) -> MediaPrompt: ...

    def check_prompt(self, ids: list[int], mm: Any) -> None: ...


# The engine's kept sessions, as the input processor reads them: the engine contract's one definition.
SessionLookup = SessionTokens
