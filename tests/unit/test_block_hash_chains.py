"""Every block hash the engine hands out names the tokens it claims (engine.kv.block_manager, engine.kv.kv_events,
engine.sessions): a KV-aware router rebuilds prefixes from BlockStored events, so for each one, over a run with
shared prefixes, evictions, a kept session and a session imported from another engine:

- its parent was stored before it (or it starts a prompt);
- each block's hash is the chain key of its parent and its tokens (``BlockManager.block_key``);
- the parent chain's tokens followed by the block's tokens are a prefix of a prompt + output that ran;

and the same for the wire events (``KVEventRecorder``: vLLM's BlockStored with external hashes), the prefix
cache's entries, each sequence's ``block_hashes`` and each kept session's pinned blocks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pytest
import torch

from mindie_service import LLM, SamplingParams
from mindie_service.engine.contract import EngineRequest
from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.kv.kv_event_wire import BlockRemoved, BlockStored
from mindie_service.engine.kv.kv_events import KVEventRecorder

BS = 4
SYSTEM = [11, 12, 13, 14, 15, 16, 17, 18, 19]  # two full blocks and one token shared by the first prompts
G = dict(temperature=0.0, ignore_eos=True)


@dataclass
class Stored:
    hashes: list[object]
    parent: object | None
    tokens: list[int]


@dataclass
class Recorder:
    """A BlockEventSink keeping the stored events in order (removals only evict)."""

    events: list[Stored] = field(default_factory=list)

    def stored(self, block_hashes: Sequence[bytes], parent_hash: bytes | None, token_ids: Sequence[int],
               lora_name: str | None) -> None:
        self.events.append(Stored(list(block_hashes), parent_hash, list(token_ids)))

    def removed(self, block_hashes: Sequence[bytes]) -> None:
        pass

    def cleared(self) -> None:
        pass


@pytest.fixture
def one_thread():
    """The hashes do not depend on the kernels' threads; one thread keeps the steps fast on a busy machine (a
    team of two on two shared cores waits at every barrier for a partner without a core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _llm(model, folder) -> LLM:
    return LLM(str(model), cache_block_size=BS, num_kv_blocks=40, max_seq_len=128, max_batch_size=4,
               swap_space_gb=0, session_spill_dir=str(folder))


def _attach(llm: LLM) -> tuple[Recorder, KVEventRecorder]:
    internal, wire = Recorder(), KVEventRecorder(BS)
    llm.engine.add_block_sink(internal)
    llm.engine.add_block_sink(wire)
    return internal, wire


def _run(llm: LLM, reqs: list[EngineRequest], runs: list[list[int]]) -> None:
    """Run ``reqs`` together; each finished sequence's prompt + output is added to ``runs``."""
    eng = llm.engine
    seqs = [eng.add_request(r) for r in reqs]
    while eng.has_work():
        eng.step()
    for s in seqs:
        runs.append(s.token_ids())
        _check_sequence(eng.blocks, s.block_hashes, s.token_ids(), s.cache_key)


def _requests(tag: str, distinct: int = 50) -> list[EngineRequest]:
    """Four prompts sharing SYSTEM (two full blocks), three others starting at token ``distinct``."""
    reqs = [EngineRequest(f"{tag}p{i}", tuple(SYSTEM + [30 + i, 31, 32 + i]), SamplingParams(max_tokens=9 + i, **G))
            for i in range(4)]
    reqs += [EngineRequest(f"{tag}d{i}", tuple(range(distinct + 7 * i, distinct + 10 + 7 * i)),
                           SamplingParams(max_tokens=7, **G)) for i in range(3)]
    return reqs


def _check_sequence(bm: BlockManager, hashes: list[bytes], tokens: list[int], key: bytes = b"") -> None:
    parent = b""
    for i, h in enumerate(hashes):
        assert h == bm.block_key(parent, tokens[i * BS:(i + 1) * BS], key), f"block {i}'s hash"
        parent = h


def _check_events(events: list[Stored], runs: list[list[int]], bm: BlockManager | None) -> dict[object, list[int]]:
    """The three properties of the module docstring; returns each stored hash's chain tokens. ``bm``: the events
    carry its internal hashes (then each hash is checked as a chain key too)."""
    chains: dict[object, list[int]] = {}
    for n, ev in enumerate(events):
        assert len(ev.tokens) == BS * len(ev.hashes), f"event {n}: {len(ev.tokens)} tokens"
        assert ev.parent is None or ev.parent in chains, f"event {n}: its parent was never stored"
        prefix = list(chains[ev.parent]) if ev.parent is not None else []
        parent = ev.parent
        for i, h in enumerate(ev.hashes):
            block = ev.tokens[i * BS:(i + 1) * BS]
            if bm is not None:
                assert h == bm.block_key(parent or b"", block), f"event {n}: block {i}'s hash"  # type: ignore[arg-type]
            prefix = prefix + block
            assert any(r[:len(prefix)] == prefix for r in runs), f"event {n}: tokens {prefix} never ran"
            chains[h] = prefix
            parent = h
    return chains


def _check_cache_and_sessions(llm: LLM, chains: dict[object, list[int]]) -> None:
    eng, bm = llm.engine, llm.engine.blocks
    for h, b in bm.cached.items():
        assert bm.block_hash[b] == h and h in chains  # every cached hash was announced, with its chain
    for key, s in eng.sessions.items():
        parent = b""
        for i, b in enumerate(s.blocks):  # a session's pins: its leading full blocks, in chain order
            h = bm.block_key(parent, list(s.token_ids[i * BS:(i + 1) * BS]))
            assert bm.block_hash[b] == h and bm.cached.get(h) == b, f"session {key}: pin {i}"
            parent = h


def _wire(recorder: KVEventRecorder) -> list[Stored]:
    return [Stored(list(e.block_hashes), e.parent_block_hash, list(e.token_ids))
            for e in recorder.pending if isinstance(e, BlockStored)]


def test_stored_blocks_name_a_prefix_that_ran(tiny_model, tmp_path, one_thread):
    runs: list[list[int]] = []
    first = _llm(tiny_model, tmp_path / "a")
    internal, wire = _attach(first)
    _run(first, _requests("a"), runs)
    kept = SYSTEM + [40, 41, 42, 43, 44]  # a kept session, continued: its pins are prefix hits
    _run(first, [EngineRequest("s0", tuple(kept), SamplingParams(max_tokens=6, **G), session_id="sess")], runs)
    (_, session), = [(k, s) for k, s in first.engine.sessions.items() if k == "sess"]
    cont = list(session.token_ids) + [45, 46]
    _run(first, [EngineRequest("s1", tuple(cont), SamplingParams(max_tokens=5, **G), session_id="sess",
                               continued=True)], runs)
    _run(first, _requests("b"), runs)  # the same prompts again: prefix hits
    _run(first, _requests("c", 200), runs)  # others: evictions in a pool this small
    assert first.engine.blocks.prefix_hits > 3 and first.engine.sessions.hits == 1
    assert any(isinstance(e, BlockRemoved) for e in wire.pending)
    chains = _check_events(internal.events, runs, first.engine.blocks)
    assert any(ev.parent is not None for ev in internal.events)  # some chains continue an earlier event
    _check_events(_wire(wire), runs, None)
    _check_cache_and_sessions(first, chains)
    data = first.engine.spill.export("sess")
    assert data is not None
    second = _llm(tiny_model, tmp_path / "b")  # another replica imports the session (management port)
    internal2, wire2 = _attach(second)
    second.engine.spill.import_(data)
    second.engine.step()  # the engine thread adopts it: its blocks are stored under the base chain
    assert second.engine.stats().session_pinned_blocks > 0
    _run(second, [EngineRequest("s2", tuple(list(first.engine.sessions.tokens("sess") or ()) + [47]),
                                SamplingParams(max_tokens=4, **G), session_id="sess", continued=True)], runs)
    chains2 = _check_events(internal2.events, runs, second.engine.blocks)
    _check_events(_wire(wire2), runs, None)
    _check_cache_and_sessions(second, chains2)
    first.shutdown()
    second.shutdown()


@pytest.mark.parametrize("bad", ["parent", "tokens"])
def test_the_checks_see_a_wrong_parent_or_shifted_tokens(bad):
    """The property itself: a stored event with a wrong parent or tokens shifted by one fails it."""
    bm = BlockManager(8, BS)
    runs = [list(range(1, 13))]
    h1 = bm.block_key(b"", runs[0][:4])
    h2 = bm.block_key(h1, runs[0][4:8])
    good = [Stored([h1], None, runs[0][:4]), Stored([h2], h1, runs[0][4:8])]
    _check_events(good, runs, bm)
    wrong = Stored([h2], None, runs[0][4:8]) if bad == "parent" else Stored([h2], h1, runs[0][5:9])
    with pytest.raises(AssertionError):
        _check_events([good[0], wrong], runs, bm)
    with pytest.raises(AssertionError):
        _check_events([good[0], wrong], runs, None)
