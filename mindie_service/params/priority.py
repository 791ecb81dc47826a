"""Request priority: each dialect's field and direction, mapped onto the scheduler's one ``rank``
(engine.sched.order: lower runs first, 0 the default; the admission queue, prefill order and preemption
victims all follow it, then arrival). This is the one table:

| routes                                          | field                 | scale, as the dialect has it                   | default | rank                     |
|-------------------------------------------------|-----------------------|------------------------------------------------|---------|--------------------------|
| OpenAI ``/v1/completions``, ``/v1/chat/...``, ``/v1/responses`` | ``priority`` (vLLM's) | an int32, lower first (vLLM's convention) | 0 | ``priority`` |
| MindIE ``POST /``, ``POST /infer``              | ``parameters.priority`` | [1, 5], 1 the most urgent                    | 5       | ``priority - 5``         |
| Triton ``/v2/.../generate(_stream)``, OIP ``/v2/.../infer`` | ``parameters.priority`` | [0, 5]: Triton's 0 is the default level, 1..5 MindIE's levels (1 the most urgent) | 0 | 0 for 0, else ``priority - 5`` |
| every other route (TGI, Anthropic, /api/*)      | none                  |                                                | -       | 0                        |
| batch-job lines (jobs/)                         | none                  | a class of their own below every online request | -      | (class PRIORITY_BATCH)   |

So MindIE's default level (5), Triton's default (0) and vLLM's default (0) are one rank; MindIE's 1 is vLLM's
-4. Within a rank, first come first served; no request starves (order.AGING_S promotes old waiters)."""
from __future__ import annotations

from typing import Any, Literal, Mapping

from mindie_service.params.ranges import INT32_MAX, closed
from mindie_service.params.rule import Field, FieldTable, Rule, read_fields

Scale = Literal["vllm", "mindie", "triton"]
MINDIE_DEFAULT = 5  # MindIE: [1, 5], 1 the most urgent, 5 the default
TRITON_DEFAULT = 0  # Triton: 0 asks for the default level
_FIELDS: dict[Scale, FieldTable] = {
    "vllm": {"priority": Field("priority", Rule("int", closed(-INT32_MAX - 1, INT32_MAX)))},
    "mindie": {"priority": Field("priority", Rule("int", closed(1, MINDIE_DEFAULT)))},
    "triton": {"priority": Field("priority", Rule("int", closed(0, MINDIE_DEFAULT)))},
}


def to_rank(scale: Scale, value: int | None) -> int:
    """The scheduler's rank for ``value`` on ``scale`` (None: the dialect's default, rank 0)."""
    if value is None or (scale == "triton" and value == TRITON_DEFAULT):
        return 0
    return value if scale == "vllm" else value - MINDIE_DEFAULT


def read_rank(obj: Mapping[str, Any], scale: Scale, prefix: str = "") -> int:
    """``obj["priority"]`` checked on ``scale`` (ValidationError naming ``prefix + "priority"``) -> its rank."""
    return to_rank(scale, read_fields(obj, _FIELDS[scale], prefix).get("priority"))
