"""Chat messages -> prompt token ids: the tokenizer's chat template, or role prefixes for a checkpoint
without one (Jan's model.json ``engine_parameters.system_prompt`` / ``user_prompt`` / ``ai_prompt``).

Used by the input processor for ``ChatPrompt`` (the OpenAI chat route) and by batch jobs. Multimodal
checkpoints render through their processor (``MediaEncoder.prepare_chat``), not here."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from mindie_service.errors import ValidationError
from mindie_service.inputs.types import ChatMessage

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


class ChatRenderer:
    """Renders messages for one text model. ``tokenizer``: a Hugging Face tokenizer (its ``chat_template``, if
    any, is used and the rendered text is encoded without adding special tokens: the template writes them);
    ``tokenize``: the processor's plain tokenizer, used for the prefix form (it adds special tokens as for
    any text prompt)."""

    def __init__(self, tokenizer: Any = None, prefixes: ChatPrefixes = ChatPrefixes()) -> None:
        self.tokenizer = tokenizer
        self.prefixes = prefixes
        self.has_template = bool(getattr(tokenizer, "chat_template", None))

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt text, ending with the assistant's generation prompt."""
        if not messages:
            raise ValidationError("Parameter messages must be a non-empty list, got []")
        plain = [{"role": m.role, "content": text_content(m, i)} for i, m in enumerate(messages)]
        if self.has_template:
            try:
                return str(self.tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True))
            except ValidationError:
                raise
            except Exception as e:  # a template that raises (e.g. roles must alternate) is the caller's input
                raise ValidationError(f"Parameter messages must fit the model's chat template: "
                                      f"{type(e).__name__}: {e}") from None
        out = [self.prefixes.of(m["role"]) + m["content"] + "\n" for m in plain]
        return "".join(out) + self.prefixes.assistant

    def encode(self, messages: Sequence[ChatMessage], tokenize: Callable[[str], list[int]]) -> list[int]:
        text = self.render(messages)
        if self.has_template:
            return list(self.tokenizer(text, add_special_tokens=False).input_ids)
        return tokenize(text)
