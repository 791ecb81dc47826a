"""Incremental detokenization: whole UTF-8 characters only, stop strings across token boundaries."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from mindie_service.engine.output.detokenizer import DetokState, TokenDecoder, flush, step


@pytest.fixture(scope="module")
def tok(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def _stream(tok, ids: list[int], stops: list[str], prompt: list[int] | None = None) -> tuple[list[str], DetokState]:
    dec = TokenDecoder(tok)
    st = DetokState.start(prompt or [tok.bos_token_id], stops)
    deltas = []
    for i in ids:
        deltas.append(step(dec, st, i))
        if st.stopped:
            break
    deltas.append(flush(dec, st))
    return deltas, st


@pytest.mark.parametrize("text", ["你好，世界！我们今天去公园散步。", "Emoji 🙂🚀 and 漢字 mixed 😀 text", "naïve café ünïcödé"])
def test_split_characters_are_never_emitted_half(tok, text):
    ids = tok(text, add_special_tokens=False).input_ids
    # The point of the test: some character really is split across byte-level tokens.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    deltas, _ = _stream(tok, ids, [])
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text


def test_stop_string_spanning_two_tokens_stops_and_is_trimmed(tok):
    text = "The harbor lantern glowed over the winter bridge near the museum"
    ids = tok(text, add_special_tokens=False).input_ids
    pieces = [tok.decode([i]) for i in ids]
    k = next(i for i in range(2, len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2)
    stop = pieces[k][-2:] + pieces[k + 1][:2]
    deltas, st = _stream(tok, ids, [stop])
    out = "".join(deltas)
    assert st.stopped
    assert stop not in out
    assert out == text[:text.index(stop)]


def test_text_held_for_a_stop_prefix_is_released_when_no_stop_follows(tok):
    text = "river mountain city"
    ids = tok(text, add_special_tokens=False).input_ids
    deltas, st = _stream(tok, ids, ["city garden"])
    assert not st.stopped and "".join(deltas) == text


def test_generation_ending_mid_character_emits_no_half_character(tok):
    ids = tok("你好世界", add_special_tokens=False).input_ids
    cut = next(k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd"))
    deltas, _ = _stream(tok, ids[:cut], [])
    out = "".join(deltas)
    assert "\ufffd" not in out and "你好世界".startswith(out)
