"""Swapping preempted requests' K/V to the host pool (ModelConfig.cpuMemSize, engine.kv.swap): the scheduler's
plain-data decisions, and the real engine giving the same greedy tokens as with a roomy pool."""
from __future__ import annotations

import pytest

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.sched.scheduler import Scheduler
from mindie_service.engine.sequence import Sequence, SeqStatus
from mindie_service.engine.kv.swap import HostBlockPool, host_pool_blocks
from mindie_service.engine.contract import EngineRequest
from mindie_service.llm import LLM
from mindie_service.sampling_params import SamplingParams
from tests.prompts import word_prompts

BS = 4


def _sched(blocks: int, host: int, **kw) -> Scheduler:
    cfg = EngineConfig(model="x", cache_block_size=BS, max_seq_len=256, max_input_token_len=64,
                       max_prefill_tokens=256, max_batch_size=4, max_prefill_batch_size=4,
                       max_preempt_count=kw.pop("max_preempt_count", 4), **kw)
    return Scheduler(cfg, BlockManager(blocks, BS, enable_prefix_caching=False), host=HostBlockPool(host))


def _seq(i: int, n: int, max_output: int = 16) -> Sequence:
    return Sequence(f"r{i}", [i + 10] * n, SamplingParams(max_tokens=max_output), max_output, seed=0)


def _run_until_preempted(s: Scheduler):
    for _ in range(20):
        out = s.schedule()
        if out.preempted:
            return out
        s.update(out, {c.request_id: 1 for c in out.sampled}, {})
    raise AssertionError("never preempted")


def test_host_pool_size_follows_cpu_mem_size_and_is_capped():
    assert host_pool_blocks(0, 1024, 10_000) == 0  # cpuMemSize 0: recompute
    assert host_pool_blocks(1, 1 << 20, 10_000) == 1024  # 1 GB of 1 MiB blocks
    assert host_pool_blocks(5, 1024, 300) == 300  # never more than can be filled


def test_preempted_decode_is_swapped_out_then_resumes_where_it_was():
    s = _sched(blocks=4, host=8)
    a, b = _seq(0, n=4), _seq(1, n=4)
    s.add(a)
    s.add(b)
    out = _run_until_preempted(s)
    b_blocks = [d for d, _ in out.swap_out]
    assert out.preempted == ["r1"] and b.status is SeqStatus.SWAPPED and list(s.swapped) == [b]
    assert len(out.swap_out) == 2 and [h for _, h in out.swap_out] == b.host_blocks  # its 2 computed blocks
    assert b.num_computed_tokens == b.num_tokens - 1 and b.block_table == []
    assert s.num_swap_outs == 1 and s.host.num_used == 2
    s.update(out, {c.request_id: 1 for c in out.sampled}, {})
    s.add(_seq(2, n=4))
    assert not s.schedule().swap_in  # a still holds the pool: b stays out, and r2 waits behind it
    s.finish(a, "length")  # room again: b comes back ahead of anything waiting
    host = list(b.host_blocks)
    out = s.schedule()
    assert [c.request_id for c in out.decodes] == ["r1"] and [c.request_id for c in out.prefills] == ["r2"]
    assert [h for h, _ in out.swap_in] == host and [d for _, d in out.swap_in] == b.block_table[:2]
    assert b.status is SeqStatus.RUNNING and set(b_blocks) <= set(range(4))
    chunk = out.decodes[0]
    assert chunk.start == b.num_tokens - 1 and len(chunk.block_table) * BS >= chunk.end  # decodes, no recompute
    assert s.num_swap_ins == 1 and s.host.num_used == 2  # the host blocks are read by this step: held
    s.update(out, {c.request_id: 1 for c in out.sampled}, {})
    out = s.schedule()
    assert s.host.num_used == len(out.swap_out)  # free once the step that read them has run


def test_without_host_room_the_victim_is_recomputed():
    s = _sched(blocks=4, host=1)  # 1 host block cannot hold 2
    a, b = _seq(0, n=4), _seq(1, n=4)
    s.add(a)
    s.add(b)
    out = _run_until_preempted(s)
    assert out.preempted == ["r1"] and not out.swap_out and b.status is SeqStatus.WAITING
    assert b.num_computed_tokens == 0 and s.num_swap_outs == 0


def test_aborting_a_swapped_request_frees_its_host_blocks():
    s = _sched(blocks=4, host=8)
    a, b = _seq(0, n=4), _seq(1, n=4)
    s.add(a)
    s.add(b)
    out = _run_until_preempted(s)
    s.update(out, {c.request_id: 1 for c in out.sampled}, {})
    assert b.status is SeqStatus.SWAPPED and s.host.num_used == 2
    s.finish(b)  # the client went away
    assert s.host.num_used == 0 and not s.swapped and b.host_blocks == [] and s.get("r1") is None


# ------------------------------------------------------------ the real engine
def _greedy(llm: LLM, prompts: list[str]) -> list[list[int]]:
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return word_prompts(8, 20, 80, seed=7)


@pytest.fixture(scope="module")
def roomy(tiny_model, prompts) -> list[list[int]]:
    llm = LLM(str(tiny_model), cache_block_size=8, num_kv_blocks=512, max_batch_size=8, max_seq_len=256,
              max_input_token_len=200, swap_space_gb=0)
    out = _greedy(llm, prompts)
    assert llm.engine.stats().num_preemptions == 0
    return out


def _tight(tiny_model, swap_gb: float) -> LLM:
    # 30 blocks of 8 tokens cannot hold 8 sequences of ~40-140 tokens: the scheduler must preempt.
    return LLM(str(tiny_model), cache_block_size=8, num_kv_blocks=30, max_batch_size=8, max_seq_len=256,
               max_input_token_len=200, swap_space_gb=swap_gb)


def test_greedy_output_unchanged_under_swapping(tiny_model, prompts, roomy):
    llm = _tight(tiny_model, swap_gb=1)
    assert _greedy(llm, prompts) == roomy
    s = llm.engine.scheduler
    assert s.num_swap_outs > 0 and s.num_swap_ins == s.num_swap_outs  # it swapped, every one came back
    st = llm.engine.stats()
    assert st.swapped == 0 and st.free_blocks == 30 and s.host.num_used == 0


def test_greedy_output_unchanged_when_recomputing(tiny_model, prompts, roomy):
    llm = _tight(tiny_model, swap_gb=0)
    assert _greedy(llm, prompts) == roomy
    assert llm.engine.stats().num_preemptions > 0 and llm.engine.scheduler.num_swap_outs == 0


def test_engine_abort_of_a_swapped_request_frees_host_and_device_blocks(tiny_model, prompts):
    llm = _tight(tiny_model, swap_gb=1)
    eng = llm.engine
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        ids = tuple(llm.tokenizer(p).input_ids)
        eng.add_request(EngineRequest(f"q{i}", ids, params))
    swapped = None
    for _ in range(400):
        eng.step()
        if eng.scheduler.swapped:
            swapped = eng.scheduler.swapped[0]
            break
    assert swapped is not None and eng.stats().swapped >= 1 and swapped.host_blocks  # its swap-out has run
    assert eng.abort_request(swapped.request_id) and swapped.status is SeqStatus.FINISHED
    while eng.has_work():
        eng.step()
    assert eng.scheduler.host.num_used == 0 and eng.stats().free_blocks == 30 and eng.stats().swapped == 0
