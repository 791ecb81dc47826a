"""The rule table: every dialect's range lies inside the engine's envelope, a message names the field as the
dialect spells it, the output cap is one function, the adapter check one function with one wording."""
from __future__ import annotations

import pytest

from mindie_service.errors import ValidationError
from mindie_service.params import table
from mindie_service.params.adapter_name import check_adapter_id, unknown_adapter_message
from mindie_service.params.output_cap import output_cap
from mindie_service.params.rule import read_fields

DIALECTS = {"mindie": table.MINDIE, "tgi": table.TGI, "openai-completion": table.OPENAI_COMPLETION,
            "openai-chat": table.OPENAI_CHAT, "vllm": table.VLLM, "job": table.JOB_OPTIONS}


def _probes(rule) -> list[float]:
    """Values around a rule's bounds (and a few ordinary ones)."""
    out = [-3, -1, 0, 1e-7, 0.5, 1, 1.5, 2, 3, 2**31, 2**64]
    for b in (rule.range.lo, rule.range.hi) if rule.range else ():
        if b is not None:
            out += [b, b - 1e-9, b + 1e-9, b - 1, b + 1]
    return [int(x) if rule.kind == "int" and float(x).is_integer() else x for x in out
            if rule.kind != "int" or float(x).is_integer()]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_dialect_range_lies_inside_the_engine_envelope(dialect) -> None:
    for name, f in DIALECTS[dialect].items():
        engine = table.ENGINE.get(f.neutral)
        if engine is None or f.rule.kind == "bool":
            continue
        for v in _probes(f.rule):
            if f.rule.accepts(v) and f.neutral not in ("top_k",):  # top_k <= 0 means off everywhere
                assert engine.rule.accepts(v), (dialect, name, v)


def test_a_message_names_the_field_as_the_dialect_spells_it() -> None:
    for t, spelled, prefix in ((table.MINDIE, "max_new_tokens", ""), (table.OPENAI_COMPLETION, "max_tokens", ""),
                               (table.JOB_OPTIONS, "max_tokens", "options.")):
        with pytest.raises(ValidationError) as e:
            read_fields({spelled: 0}, t, prefix)
        assert str(e.value) == f"Parameter {prefix}{spelled} must be in (0, 2147483647], got 0"
    assert read_fields({"max_new_tokens": 7, "top_n_tokens": 3}, table.MINDIE) == {"max_tokens": 7, "logprobs": 3}
    assert read_fields({"max_tokens": 5, "max_completion_tokens": 9}, table.OPENAI_CHAT) == {"max_tokens": 9}


def test_the_output_cap() -> None:
    assert output_cap(1000, 10, max_iter_times=64, max_seq_len=256) == 64
    assert output_cap(1000, 250, max_iter_times=64, max_seq_len=256) == 6
    assert output_cap(1000, 10, max_iter_times=64, max_seq_len=256, pool_tokens=40) == 30
    assert output_cap(5, 10, max_iter_times=64) == 5
    assert output_cap(5, 256, max_iter_times=64, max_seq_len=256) == 1  # never below one token


def test_the_adapter_check() -> None:
    assert check_adapter_id(None) is None and check_adapter_id("None", ["a"]) is None
    assert check_adapter_id("a", ["a"]) == "a" and check_adapter_id("anything") == "anything"
    with pytest.raises(ValidationError) as e:
        check_adapter_id("b", ["a"])
    assert str(e.value) == unknown_adapter_message("b")
    with pytest.raises(ValidationError, match=r"adapter_id must be a string matching"):
        check_adapter_id("bad id!", ["bad id!"])
