"""Structured output, read the way each dialect spells it (``table.STRUCTURED``)."""
from __future__ import annotations

from typing import Any, Mapping

from mindie_service.params.table import STRUCTURED
from mindie_service.structured import request_forms
from mindie_service.structured.spec import StructuredSpec

_FORMS = {"response_format": request_forms.response_format, "tgi_grammar": request_forms.tgi_grammar}


def read_structured(obj: Mapping[str, Any], dialect: str, prefix: str = "") -> StructuredSpec | None:
    """The spec ``obj`` asks for in ``dialect``'s spelling (None: unconstrained); vLLM's reads the whole body."""
    field, form = STRUCTURED[dialect]
    if form == "vllm":
        return request_forms.vllm_fields(dict(obj))
    return _FORMS[form](obj.get(field), prefix + field)
