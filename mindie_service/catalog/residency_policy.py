"""Residency's rules from ServerConfig: whether a business-plane request may load a model (and which), how long
it may wait, how many models may be loaded at once and the memory they may take together (``modelMemoryBudget``:
a size such as "6GiB" or a share such as "50%" of the host's memory, or of the device's where the models run on
one), and how long an idle model stays loaded (``idleUnloadSeconds``, per model in model.json's
engine_parameters)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from mindie_service.errors import ValidationError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SHARE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_MULT = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
BUDGET_RULE = 'a size such as "6GiB", "512MiB", "8GB" or a share of the memory such as "50%"'


def check_budget(text: str) -> None:
    """Raise ValueError (naming the rule) for a modelMemoryBudget that is neither a size nor a share."""
    m = _SHARE.match(text)
    if m is not None:
        if not 0 < float(m.group(1)) <= 100:
            raise ValueError(f"modelMemoryBudget must be a share in (0%, 100%], got {text!r}")
        return
    m = _SIZE.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"modelMemoryBudget must be {BUDGET_RULE}, got {text!r}")


def budget_bytes(text: str, total_memory: Callable[[], int]) -> int:
    """The budget in bytes: a size as written (binary or decimal units; bare digits are bytes), a share of
    ``total_memory()``."""
    check_budget(text)
    m = _SHARE.match(text)
    if m is not None:
        return int(total_memory() * float(m.group(1)) / 100.0)
    m = _SIZE.match(text)
    assert m is not None
    return int(float(m.group(1)) * _MULT[(m.group(2) or "B").lower()])


@dataclass(frozen=True)
class ResidencyPolicy:
    business_loads: bool = True  # a business-plane request naming a stopped model loads it
    loadable: tuple[str, ...] | None = None  # the models it may load (None: every catalog model)
    load_timeout_s: float = 300.0  # modelLoadTimeoutSeconds: how long a request waits for its model
    max_loaded: int | None = None  # maxLoadedModels (None: no cap)
    budget: str | None = None  # modelMemoryBudget as configured (None: no budget)
    idle_unload_s: float | None = None  # idleUnloadSeconds of every model (None: never), model.json may say

    def may_load(self, model_id: str) -> bool:
        return self.business_loads and (self.loadable is None or model_id in self.loadable)

    def why_not(self, model_id: str) -> str:
        if not self.business_loads:
            return "requests do not load models here (ServerConfig.businessModelLoads is false)"
        return f"requests may load only {', '.join(self.loadable or ())} (ServerConfig.loadableModels)"

    @classmethod
    def from_settings(cls, s: Any) -> "ResidencyPolicy":
        loadable = getattr(s, "loadable_models", None)
        return cls(business_loads=getattr(s, "business_model_loads", True),
                   loadable=None if loadable is None else tuple(loadable),
                   load_timeout_s=getattr(s, "model_load_timeout", 300.0),
                   max_loaded=getattr(s, "max_loaded_models", None), budget=getattr(s, "model_memory_budget", None),
                   idle_unload_s=getattr(s, "idle_unload_seconds", None))


def idle_seconds(engine_parameters: dict[str, Any], default: float | None) -> float | None:
    """A model's idleUnloadSeconds: model.json's engine_parameters (a number > 0, or null for never) over the
    server's; a bad value is refused when the model is loaded (ValidationError naming it)."""
    if "idleUnloadSeconds" not in engine_parameters:
        return default
    v = engine_parameters["idleUnloadSeconds"]
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ValidationError(f"engine_parameters.idleUnloadSeconds must be a number of seconds > 0 or null, "
                              f"got {v!r}")
    return float(v)
