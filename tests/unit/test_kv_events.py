"""KV-cache events in vLLM's wire format (engine.kv.kv_events): a subscriber with plain pyzmq + msgspec rebuilds
the engine's prefix cache from them while a mixed workload runs (prefix hits, evictions, preemption, a LoRA
adapter, a session), the replay socket gives the same batches back, and a full queue drops, never blocks."""
from __future__ import annotations

import threading
import time
from itertools import count

import pytest

from mindie_service import LLM, SamplingParams
from mindie_service.devkit.lora import build_demo_lora
from mindie_service.engine.configs.kv_events_config import KVEventsConfig
from mindie_service.engine.kv.kv_event_wire import KVEventBatch, decode_batch, external_hash
from mindie_service.engine.kv.kv_events import ZmqKVEventPublisher
from mindie_service.inputs import TextPrompt
from tests.kv_event_client import Subscriber, free_port, rebuild

SYSTEM = "You are a careful assistant. Answer briefly and cite the river, the mill and the old stone bridge. "


@pytest.fixture(scope="module")
def adapter(tiny_model, tmp_path_factory):
    return str(build_demo_lora(str(tiny_model), str(tmp_path_factory.mktemp("kv-lora") / "ad"), rank=8, seed=3))


def _workload(llm: LLM) -> dict[str, list[int]]:
    """Shared-prefix prompts, distinct prompts, an adapter's prompts and a session, run concurrently in a pool
    small enough to evict and preempt."""
    eng, proc = llm.engine, llm.input_processor
    g = dict(temperature=0.0, ignore_eos=True)
    reqs = [(f"p{i}", SYSTEM + f"question {i}?", SamplingParams(max_tokens=24, **g), None) for i in range(6)]
    reqs += [(f"d{i}", f"{i} distinct words " * 6, SamplingParams(max_tokens=30, **g), None) for i in range(6)]
    reqs += [(f"l{i}", SYSTEM + "adapter", SamplingParams(max_tokens=12, adapter_id="ad", **g), None) for i in range(2)]
    reqs += [("s0", "The river runs past the mill", SamplingParams(max_tokens=10, **g), "sess")]
    outs: dict[str, list[int]] = {}
    for rid, text, params, session in reqs:
        eng.add_request(proc.process(TextPrompt(text), params, request_id=rid, session_id=session))
    while eng.has_work():
        for ev in eng.step():
            outs.setdefault(ev.request_id, []).append(ev.token.id)
    cont = proc.process(TextPrompt(""), SamplingParams(max_tokens=6, **g), request_id="s1", session_id="sess")
    eng.add_request(cont)  # the session continues: its pinned blocks are prefix hits
    while eng.has_work():
        eng.step()
    return outs


def _until(cond, guard_s: float = 60.0) -> bool:
    """Poll ``cond``; the guard only stops a hang (the condition holds at once on any machine that works)."""
    end = time.monotonic() + guard_s
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


def _joined(llm: LLM, sub: Subscriber) -> int:
    """A PUB socket drops what it sends before a subscription reaches it (ZMQ's slow joiner), however long that
    takes: the fresh engine's AllBlocksCleared is sent again until one arrives. Its sequence number."""
    kv = llm.engine.kv_events
    for _ in range(6000):  # a minute at most: a join, not a speed bound
        kv.recorder.cleared()
        kv.end_step()
        time.sleep(0.01)
        if sub.frames:
            return sub.frames[0][1]
    raise AssertionError("the subscriber never joined")


def test_subscriber_rebuilds_the_prefix_cache_from_the_events(tiny_model, adapter):
    port, replay = free_port(), free_port()
    cfg = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://127.0.0.1:{port}",
                         replay_endpoint=f"tcp://127.0.0.1:{replay}", topic="kv")
    llm = LLM(str(tiny_model), cache_block_size=4, num_kv_blocks=40, max_seq_len=128, max_batch_size=8,
              swap_space_gb=0, max_loras=1, max_lora_rank=8, kv_events=cfg)
    llm.engine.load_adapter("ad", adapter)
    sub = Subscriber(cfg.endpoint, "kv")
    kv = llm.engine.kv_events
    handed = count()
    publish = kv.publisher.publish
    kv.publisher.publish = lambda batch: (next(handed), publish(batch))  # type: ignore[method-assign]
    try:
        first = _joined(llm, sub)
        _workload(llm)
        st, bm = llm.engine.stats(), llm.engine.blocks
        assert st.num_preemptions > 0 and bm.prefix_hits > 0 and st.session_hits == 1
        total = next(handed)  # batches handed to the publisher
        assert _until(lambda: kv.stats().published_batches == total)  # every one sent (none dropped here)
        published = kv.stats().published_batches
        assert _until(lambda: len(sub.frames) == published - first)  # and received
        seqs = [s for _, s, _ in sub.frames]
        assert seqs == list(range(first, published)) and {t for t, _, _ in sub.frames} == {b"kv"}
        batches = sub.batches()
        assert batches[0]["events"][0] == {"type": "AllBlocksCleared"}
        events = [e for b in batches for e in b["events"]]
        assert any(e["type"] == "BlockRemoved" for e in events)  # the pool evicted
        assert {e.get("lora_name") for e in events if e["type"] == "BlockStored"} == {None, "ad"}
        cached, problems = rebuild(batches)
        assert not problems
        assert cached == {external_hash(h) for h in bm.cached}
        # the replay socket gives the very payloads back, from any sequence number on
        again = sub.replay(cfg.replay_endpoint, sub.frames[3][1])
        assert again == [(s, p) for _, s, p in sub.frames[3:]]
        assert [s for s, _ in sub.replay(cfg.replay_endpoint, 0)] == list(range(published))  # the joins' too
        assert isinstance(decode_batch(again[0][1]), KVEventBatch)  # vLLM's classes decode it
    finally:
        sub.close()
        llm.shutdown()


def test_a_full_queue_drops_batches_and_counts_them(monkeypatch):
    """``publish`` never waits for the sender: with the sender held inside a send, the one queue slot fills and
    every further batch is dropped and counted (how fast the sender would have been does not matter)."""
    pub = ZmqKVEventPublisher(KVEventsConfig(enable_kv_cache_events=True,
                                             endpoint=f"tcp://127.0.0.1:{free_port()}", max_queue_size=1))
    sending, release = threading.Event(), threading.Event()
    send = pub._send

    def held(pack, batch):
        sending.set()
        release.wait()
        send(pack, batch)

    monkeypatch.setattr(pub, "_send", held)
    n = 5000
    try:
        pub.publish(KVEventBatch(ts=0.0, events=[]))  # taken by the sender, which holds it
        assert sending.wait(60)
        publisher = threading.Thread(target=lambda: [pub.publish(KVEventBatch(ts=float(i), events=[]))
                                                     for i in range(1, n)], daemon=True)
        publisher.start()
        publisher.join(30)  # a hang guard: n non-blocking puts
        assert not publisher.is_alive()  # a blocking put would wait here for the held sender
        st = pub.stats()
        assert (st.queued_batches, st.dropped_batches, st.published_batches) == (1, n - 2, 0)
    finally:
        release.set()
        pub.shutdown()
    st = pub.stats()
    assert (st.published_batches, st.dropped_batches) == (2, n - 2)
