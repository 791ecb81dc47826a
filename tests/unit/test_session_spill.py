"""Sessions on disk and between replicas (engine.sessions.session_spill): a spilled session continues after a restart
without recomputing its prefix and equals an uninterrupted greedy generation; a damaged or another model's
file never feeds the model (tokens only, or refused); a session moves between two engines token-identical."""
from __future__ import annotations

from pathlib import Path

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.engine.sessions.session_spill import SUFFIX, SessionSpill
from mindie_service.inputs import TextPrompt

PROMPT = "The river runs past the old mill and the stone bridge, where the miller keeps his"
G = dict(temperature=0.0, ignore_eos=True)
BS = 16


def _llm(model, spill: Path | None, **kw) -> LLM:
    kw = {"cache_block_size": BS, "num_kv_blocks": 128, "max_seq_len": 512, "max_iter_times": 256, **kw}
    return LLM(str(model), session_spill_dir=str(spill) if spill else None, **kw)


def _run(llm: LLM, rid: str, n: int, session: str | None = None, prompt: str = PROMPT):
    """(prompt ids, output ids, the tokens of its prompt taken from the prefix cache)."""
    eng = llm.engine
    seq = eng.add_request(llm.input_processor.process(TextPrompt(prompt), SamplingParams(max_tokens=n, **G),
                                                      request_id=rid, session_id=session))
    out: list[int] = []
    cached = None
    while eng.has_work():
        for ev in eng.step():
            if cached is None:
                cached = seq.num_cached_tokens
            out.append(ev.token.id)
    return list(seq.prompt_token_ids), out, cached


@pytest.fixture(scope="module")
def reference(tiny_model):
    """An uninterrupted greedy generation of 60 tokens, and its first 21 (the session's first turn)."""
    llm = _llm(tiny_model, None)
    _, whole, _ = _run(llm, "whole", 60)
    return whole


def _spilled(tiny_model, tmp_path) -> tuple[Path, list[int]]:
    llm = _llm(tiny_model, tmp_path)
    _, first, _ = _run(llm, "a", 21, session="s1")
    llm.shutdown()  # the drain: the kept session goes to disk
    (path,) = tmp_path.glob("*" + SUFFIX)
    return path, first


def test_a_restarted_engine_continues_without_recomputing_the_prefix(tiny_model, tmp_path, reference):
    path, first = _spilled(tiny_model, tmp_path)
    llm = _llm(tiny_model, tmp_path)  # the restart reads it back
    assert not path.exists() and llm.engine.stats().sessions_held == 1
    prompt, second, cached = _run(llm, "b", 39, session="s1", prompt="ignored")
    assert prompt[-21:] == first  # the continuation's prompt: the session's tokens
    assert cached == len(prompt) // BS * BS > 0  # every full block came from the file: no prefix recompute
    assert first + second == reference


def test_a_damaged_kv_part_is_recomputed_from_the_tokens(tiny_model, tmp_path, reference):
    path, first = _spilled(tiny_model, tmp_path)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF  # inside the KV bytes
    path.write_bytes(bytes(data))
    llm = _llm(tiny_model, tmp_path)
    assert llm.engine.stats().sessions_held == 1 and llm.engine.stats().session_pinned_blocks == 0
    _, second, cached = _run(llm, "b", 39, session="s1", prompt="ignored")
    assert cached == 0 and first + second == reference


def test_another_models_file_gives_tokens_only_and_a_damaged_header_is_refused(tiny_model, tmp_path, reference):
    path, first = _spilled(tiny_model, tmp_path)
    llm = _llm(tiny_model, tmp_path, kv_cache_dtype="int8")  # another KV dtype: not this model's K/V
    assert llm.engine.stats().sessions_held == 1 and llm.engine.stats().session_pinned_blocks == 0
    llm.shutdown()
    (path,) = tmp_path.glob("*" + SUFFIX)
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # inside the header: nothing in the file can be trusted
    path.write_bytes(bytes(data))
    llm = _llm(tiny_model, tmp_path)
    assert llm.engine.stats().sessions_held == 0 and llm.engine.spill.refused == 1
    assert list(tmp_path.glob("*.refused"))


def test_a_session_moves_between_two_engines_token_identical(tiny_model, tmp_path, reference):
    a, b = _llm(tiny_model, tmp_path / "a"), _llm(tiny_model, tmp_path / "b")
    _, first, _ = _run(a, "a", 21, session="s1")
    data = a.engine.spill.export("s1")
    assert data is not None and b.engine.spill.export("s1") is None
    done = b.engine.spill.import_(data)
    while b.engine.has_work():  # the engine thread adopts it at its next step
        b.engine.step()
    assert done.is_set()
    _, second, cached = _run(b, "b", 39, session="s1", prompt="ignored")
    assert cached > 0 and first + second == reference
    with pytest.raises(Exception, match="not a session file"):
        b.engine.spill.import_(b"garbage" * 20)
    assert isinstance(b.engine.spill, SessionSpill)


def test_a_session_pushed_out_of_memory_is_written_first(tiny_model, tmp_path):
    llm = _llm(tiny_model, tmp_path, max_sessions=1)
    _run(llm, "a", 8, session="old")
    assert not list(tmp_path.glob("*" + SUFFIX))
    _run(llm, "b", 8, session="new", prompt="Another prompt about the harbor and its lantern")  # "old" is dropped
    llm.engine.spill.writer.flush()
    assert len(list(tmp_path.glob("*" + SUFFIX))) == 1 and llm.engine.spill.export("old") is not None


def test_an_evicted_session_is_written_off_the_engine_thread(tiny_model, tmp_path, monkeypatch):
    """The engine thread copies the K/V and goes on; a slow disk holds only the writer thread, and until the file
    is written the session's bytes are exported from memory."""
    import threading

    from mindie_service.engine.sessions import spill_writer

    gate, real = threading.Event(), spill_writer.write_atomic
    monkeypatch.setattr(spill_writer, "write_atomic", lambda path, data: (gate.wait(30), real(path, data)))
    llm = _llm(tiny_model, tmp_path, max_sessions=1)
    _run(llm, "a", 8, session="old")
    _run(llm, "b", 8, session="new", prompt="Another prompt about the harbor and its lantern")  # "old" is dropped
    spill = llm.engine.spill
    assert not list(tmp_path.glob("*" + SUFFIX))  # the step returned while the write waits
    queued = spill.export("old")
    assert queued is not None
    gate.set()
    spill.writer.flush()
    (path,) = tmp_path.glob("*" + SUFFIX)
    assert path.read_bytes() == queued and spill.writer.pending(path) is None
