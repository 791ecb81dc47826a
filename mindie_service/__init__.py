"""mindie-service: an LLM inference service in the style of Huawei's MindIE Server."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mindie_service.sampling_params import SamplingParams

if TYPE_CHECKING:
    from mindie_service.llm import LLM

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # LLM pulls in torch and transformers: import it only when asked for.
    if name == "LLM":
        from mindie_service.llm import LLM
        return LLM
    raise AttributeError(name)
