"""mindie-service: an LLM inference service in the style of Huawei's MindIE Server."""
from __future__ import annotations

import os

# torch-npu >= 2.5.1 registers itself to load on `import torch`; on a host without CANN that import then
# fails outright. Off here (before anything imports torch), torch_npu is imported explicitly by
# npu_ops.device, where a failure is a logged fallback, not a crash.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from typing import TYPE_CHECKING, Any  # noqa: E402

from mindie_service.sampling_params import SamplingParams  # noqa: E402

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
