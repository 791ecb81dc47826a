"""The tool-call format of a model's engine (the chat and Responses routes share it)."""
from __future__ import annotations

from typing import Any

from mindie_service.engine.client import EngineClient
from mindie_service.structured.tool_formats import ToolFormat, detect, for_tokenizer


def tool_format(engine: EngineClient, ctx: Any) -> ToolFormat:
    """The model's tool-call format: the config's toolCallParser, else the one its chat template writes."""
    tok = getattr(getattr(engine, "input_facts", None), "tokenizer", None)
    cfg = getattr(ctx, "engine_config", None)
    fmt = detect(getattr(tok, "chat_template", None), getattr(getattr(cfg, "structured", None), "tool_call_parser", ""))
    return for_tokenizer(fmt, tok)  # the marker by its special token id, where the tokenizer has one
