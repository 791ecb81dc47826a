"""``adapter_id``, checked by one function with one message per rule, whichever dialect names it."""
from __future__ import annotations

import re
from collections.abc import Collection

from mindie_service.errors import ValidationError, check

# The adapter name that means "the base model" (MindIE's adapter_id default); the offline API also takes None.
BASE_ADAPTER = "None"
ADAPTER_RE = re.compile(r"^[a-zA-Z0-9_./-]{1,256}$")


def is_base_adapter(name: str | None) -> bool:
    return name is None or name == BASE_ADAPTER


def unknown_adapter_message(name: object, shown: str = "adapter_id") -> str:
    """The one wording of an unknown adapter (422 on the routes, ValueError offline)."""
    return f"Parameter {shown} must name a loaded LoRA adapter or \"{BASE_ADAPTER}\", got {name!r}"


def check_adapter_id(name: str | None, loaded: Collection[str] | None = None, shown: str = "adapter_id") -> str | None:
    """The adapter a request names, or None for the base model. Its spelling is checked always; ``loaded``
    (the adapters there are now) when the caller knows them: the parser does not, the input processor and
    the engine's LoRA manager do."""
    if is_base_adapter(name):
        return None
    check(isinstance(name, str) and ADAPTER_RE.match(name) is not None, shown,
          f"a string matching {ADAPTER_RE.pattern}", name)
    if loaded is not None and name not in loaded:
        raise ValidationError(unknown_adapter_message(name, shown))
    return name
