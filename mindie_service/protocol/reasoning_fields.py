"""The reasoning fields of each dialect -> the engine's thinking budget and the chat template's kwargs.

The split itself is the engine's (engine.output.reasoning); a model whose chat template does not think has no
split, and a budget asked of it is refused (the engine says so). Here:

- chat: ``thinking_token_budget`` (vLLM's name: thinking tokens before ``</think>`` is forced);
  ``reasoning_effort`` ``low`` / ``medium`` / ``high`` -> a budget of ``EFFORT_BUDGETS`` tokens (1024 / 4096 /
  16384; ``thinking_token_budget`` wins where both are given), ``none`` / ``minimal`` -> the template kwarg
  ``enable_thinking: false`` (a template without that kwarg ignores it, as vLLM's does);
  ``chat_template_kwargs`` (vLLM's: extra variables for the chat template, e.g. ``{"enable_thinking": false}``;
  they win over what ``reasoning_effort`` sets).
- Messages: ``thinking: {"type": "enabled", "budget_tokens": N}`` (N >= 1 and below ``max_tokens``, as
  Anthropic's; Anthropic's floor of 1024 is not enforced: a smaller budget is honoured) -> a budget of N;
  ``{"type": "disabled"}`` -> ``enable_thinking: false``; absent: the template's default.
- MindIE ``POST /``: ``parameters.thinking_budget`` (protocol.mindie; its text stays whole, markers included)."""
from __future__ import annotations

from typing import Any

from mindie_service.errors import check
from mindie_service.params.ranges import INT32_MAX

EFFORT_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384}
NO_THINKING = ("none", "minimal")
MAX_TEMPLATE_KWARGS = 32
# apply_chat_template's own arguments: a client's kwargs may not replace them
RESERVED_KWARGS = frozenset({"conversation", "messages", "tools", "documents", "chat_template", "tokenize",
                             "add_generation_prompt", "continue_final_message", "padding", "truncation",
                             "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
                             "tokenizer_kwargs"})


def budget(v: Any, where: str) -> int | None:
    check(v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INT32_MAX), where,
          f"an integer from 0 to {INT32_MAX}", v)
    return v


def template_kwargs(v: Any, where: str = "chat_template_kwargs") -> dict[str, Any]:
    if v is None:
        return {}
    check(isinstance(v, dict) and len(v) <= MAX_TEMPLATE_KWARGS, where,
          f"an object of at most {MAX_TEMPLATE_KWARGS} chat-template variables", v)
    for k in v:
        check(isinstance(k, str) and k.isidentifier() and k not in RESERVED_KWARGS, f"{where}.{k}",
              "a template variable name (not one of apply_chat_template's own arguments)", k)
    return dict(v)


def chat_reasoning(body: dict[str, Any]) -> tuple[int | None, dict[str, Any]]:
    """(thinking budget, chat-template kwargs) of a chat body."""
    effort = body.get("reasoning_effort")
    check(effort is None or effort in (*NO_THINKING, *EFFORT_BUDGETS), "reasoning_effort",
          "none, minimal, low, medium or high", effort)
    kwargs: dict[str, Any] = {"enable_thinking": False} if effort in NO_THINKING else {}
    kwargs.update(template_kwargs(body.get("chat_template_kwargs")))
    n = budget(body.get("thinking_token_budget"), "thinking_token_budget")
    if n is None and effort in EFFORT_BUDGETS:
        n = EFFORT_BUDGETS[effort]
    return n, kwargs


def messages_thinking(th: Any, max_tokens: Any) -> tuple[int | None, dict[str, Any]]:
    """(thinking budget, chat-template kwargs) of a Messages ``thinking`` field."""
    if th is None:
        return None, {}
    check(isinstance(th, dict) and th.get("type") in ("enabled", "disabled"), "thinking",
          '{"type": "enabled", "budget_tokens": N} or {"type": "disabled"}', th)
    if th["type"] == "disabled":
        check(set(th) == {"type"}, "thinking", '{"type": "disabled"} alone', th)
        return None, {"enable_thinking": False}
    check(set(th) == {"type", "budget_tokens"}, "thinking", '{"type": "enabled", "budget_tokens": N}', th)
    n = th["budget_tokens"]
    top = max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else INT32_MAX
    check(isinstance(n, int) and not isinstance(n, bool) and 1 <= n < top, "thinking.budget_tokens",
          f"an integer from 1 to max_tokens - 1 ({top - 1})", n)
    return n, {}
