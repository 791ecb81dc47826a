"""Continue a finished generation by its session key (engine.sessions.session_store): tokens are the truth, pinned
prefix-cache blocks only a cache, bounded and released least recently used first."""
from __future__ import annotations

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.sessions.session_store import SessionStore
from mindie_service.inputs import TextPrompt

PROMPT = "The river runs past the old mill and"


def _run(llm: LLM, request_id: str, prompt: str, params: SamplingParams, session: str | None = None):
    """Process + run one request to its end: (prompt ids, output ids, finish reason)."""
    eng = llm.engine
    req = llm.input_processor.process(TextPrompt(prompt), params, request_id=request_id, session_id=session)
    eng.add_request(req)
    out: list[int] = []
    reason = None
    while reason is None:
        for ev in eng.step():
            assert ev.request_id == request_id
            out.append(ev.token.id)
            reason = ev.finish_reason
    return list(req.prompt_token_ids), out, reason


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=128, max_seq_len=512, max_iter_times=256)


def test_greedy_continuation_equals_one_generation_of_the_summed_length(llm):
    g = dict(temperature=0.0, ignore_eos=True)
    p0, first, r0 = _run(llm, "a", PROMPT, SamplingParams(max_tokens=21, **g), session="s1")
    assert r0 == "length"
    p1, second, _ = _run(llm, "b", "this prompt is ignored", SamplingParams(max_tokens=30, **g), session="s1")
    assert p1 == p0 + first  # the continuation's prompt: prompt + everything generated so far
    _, whole, _ = _run(llm, "c", PROMPT, SamplingParams(max_tokens=51, **g))
    assert first + second == whole
    # its pinned blocks were found in the prefix cache: only the last partly filled block was recomputed
    st = llm.engine.stats()
    assert st.session_hits == 1 and st.sessions_held == 1


def test_continuation_after_a_stop_string_keeps_its_tokens_in_context(llm):
    g = dict(temperature=0.0, ignore_eos=True)
    _, plain, _ = _run(llm, "t0", PROMPT, SamplingParams(max_tokens=20, **g))
    stop = llm.tokenizer.decode(plain[8:10]).strip()
    assert stop
    p0, out, reason = _run(llm, "t1", PROMPT, SamplingParams(max_tokens=20, stop=[stop], **g), session="stop")
    assert reason == "stop_sequence"
    p1, _, _ = _run(llm, "t2", "", SamplingParams(max_tokens=3, **g), session="stop")
    assert p1 == p0 + out  # the tokens that made the stop text stay in the session's context
    assert stop in llm.tokenizer.decode(p1[len(p0):])


def test_evicted_session_recomputes_from_its_tokens(tiny_model):
    small = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=40, max_seq_len=512, max_iter_times=256)
    g = dict(temperature=0.0, ignore_eos=True)
    _run(small, "v1", PROMPT, SamplingParams(max_tokens=40, **g), session="ev")
    store = small.engine.sessions
    assert store.pinned > 0 and store.release(small.engine.blocks.num_blocks)  # as under KV pressure
    assert store.pinned == 0
    # Two ~28-block prompts cycle through the 40-block pool: none of the session's K/V survives.
    for i, words in enumerate(("ocean castle ", "mountain city ")):
        _run(small, f"flood{i}", words * 110, SamplingParams(max_tokens=1, **g))
    _, cont, _ = _run(small, "v2", "", SamplingParams(max_tokens=10, **g), session="ev")
    _, whole, _ = _run(small, "v3", PROMPT, SamplingParams(max_tokens=50, **g))
    assert whole[40:] == cont


def _seq(rid: str, n: int, session: str) -> Sequence:
    return Sequence(rid, list(range(10, 10 + n)), SamplingParams(max_tokens=4), 4, 0, session_id=session)


def _finish(bm: BlockManager, store: SessionStore, seq: Sequence) -> None:
    assert bm.allocate(seq)
    seq.num_computed_tokens = seq.num_tokens
    bm.register_computed(seq)
    store.keep(seq)
    bm.free_seq(seq)


def test_pins_are_bounded_by_count_and_kv_share_lru_first():
    bm = BlockManager(20, 4)
    now = [0.0]
    store = SessionStore(bm, max_sessions=2, kv_share=0.5, idle_seconds=100, max_tokens=10_000,
                         clock=lambda: now[0])
    for i, key in enumerate(("a", "b", "c")):
        now[0] = float(i)
        s = _seq(key, 16 + i * 4, key)
        s.prompt_token_ids = [100 * (i + 1) + t for t in range(16 + i * 4)]  # no shared prefix
        _finish(bm, store, s)
    assert store.tokens("a") is None and store.tokens("b") is not None  # count bound: oldest dropped
    assert store.pinned <= 10 and store.evictions >= 1
    pinned_refs = sum(1 for r in bm.ref_counts if r > 0)
    assert pinned_refs == store.pinned  # every pin is one reference, nothing leaked
    now[0] = 200.0
    store.expire()
    assert len(store) == 0 and store.pinned == 0 and all(r == 0 for r in bm.ref_counts)
