"""Tensor parallelism over torch.distributed on the CPU (gloo, two processes) through the offline API:
greedy tokens equal one rank's on the 16-prompt parity set, with LoRA adapters loaded at run time,
and for a multimodal (tiny-vl) request; a rank killed mid-generation fails the engine promptly.

Parity rule: the two ranks' all-reduce sums partial products in another order than one rank's matmul,
so logits differ in the last bits. A greedy token may flip only where one rank's top two logits are
within 1e-5 of each other; the tokens are compared up to that flip, and a flip anywhere else fails."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mindie_service import LLM, SamplingParams
from mindie_service.config import load_config
from mindie_service.devkit.lora import build_demo_lora
from mindie_service.engine.async_engine import AsyncEngine
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.devkit.presets import build_demo_model
from mindie_service.errors import EngineDeadError
from tests.prompts import word_prompts
from tests.server_utils import free_port, wait_until, write_config

MAX_TOKENS = 24
TIE = 1e-5
KW = dict(cache_block_size=16, num_kv_blocks=256, max_seq_len=512, max_batch_size=16)


def parity_prompts() -> list[str]:
    """The 16-prompt parity set of test_engine_vs_transformers: 12 of 3-120 words, 4 sharing a prefix."""
    shared = "Harbor lantern winter bridge orange violin forest letter museum thunder candle meadow " * 3
    return word_prompts(12, 3, 120, seed=1) + [shared + p for p in word_prompts(4, 3, 20, seed=2)]


def greedy(llm: LLM, prompts: list, adapter_id: str | None = None) -> list[tuple[list[int], list[dict]]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=2, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False, adapter_id=adapter_id)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


def assert_same_up_to_ties(tp: list, ref: list) -> int:
    """Tokens equal, or equal up to a flip where the reference's top two logprobs tie within TIE.
    Returns how many sequences flipped."""
    flips = 0
    for i, ((got, _), (want, want_lp)) in enumerate(zip(tp, ref)):
        if got == want:
            continue
        k = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
        top = sorted(want_lp[k].values(), reverse=True)
        assert top[0] - top[1] < TIE, f"prompt {i}: token {k} differs ({got[k]} vs {want[k]}) with a top-2 gap " \
                                      f"of {top[0] - top[1]:.2e}"
        flips += 1
    return flips


@pytest.fixture(scope="module")
def lora_dir(tiny_model, tmp_path_factory) -> Path:
    # Every target (q, k, v, o, gate, up, down): column- and row-parallel shards both carry deltas.
    return build_demo_lora(str(tiny_model), str(tmp_path_factory.mktemp("lora") / "a"), rank=8, seed=3, gain=1.0)


@pytest.fixture(scope="module")
def ref(tiny_model):
    return LLM(str(tiny_model), **KW)


@pytest.fixture(scope="module")
def tp(tiny_model):
    llm = LLM(str(tiny_model), world_size=2, **KW)
    yield llm
    llm.shutdown()


def test_two_ranks_give_one_ranks_greedy_tokens_on_the_parity_set(tp, ref):
    prompts = parity_prompts()
    assert len(prompts) == 16
    want = greedy(ref, prompts)
    got = greedy(tp, prompts)
    assert assert_same_up_to_ties(got, want) <= 1
    assert sum(g[0] == w[0] for g, w in zip(got, want)) >= 15
    assert tp.engine.ranks is not None and tp.engine.model.dims.heads == 2  # really split: 2 of 4 heads here


def test_lora_adapter_loaded_at_run_time_matches_one_rank(tp, ref, lora_dir):
    prompts = parity_prompts()[:6]
    for llm in (tp, ref):
        llm.engine.load_adapter("tp-a", str(lora_dir))
    try:
        want = greedy(ref, prompts, adapter_id="tp-a")
        assert want != greedy(ref, prompts)  # the adapter changes the output, so parity means it ran on both ranks
        assert assert_same_up_to_ties(greedy(tp, prompts, adapter_id="tp-a"), want) <= 1
    finally:
        for llm in (tp, ref):
            llm.engine.unload_adapter("tp-a")
    # Unloaded on every rank: the name loads again (a new adapter) and still matches.
    for llm in (tp, ref):
        llm.engine.load_adapter("tp-a", str(lora_dir))
    assert assert_same_up_to_ties(greedy(tp, prompts[:2], adapter_id="tp-a"),
                                  greedy(ref, prompts[:2], adapter_id="tp-a")) <= 1


def test_multimodal_request_under_tensor_parallelism(tmp_path_factory):
    vl = Path(__file__).resolve().parents[2] / "models" / "tiny-vl"
    build_demo_model("tiny-vl", str(vl), if_missing=True)
    img = Image.fromarray((np.random.RandomState(0).rand(40, 50, 3) * 255).astype(np.uint8))
    prompts = [{"parts": [{"type": "image", "image": img}, {"type": "text", "text": "What is in the picture?"}]},
               {"parts": [{"type": "text", "text": "Tell me a story about a river."}]}]
    want = greedy(LLM(str(vl), **KW), prompts)
    with LLM(str(vl), world_size=2, **KW) as tp_vl:
        assert assert_same_up_to_ties(greedy(tp_vl, prompts), want) == 0


def test_a_killed_rank_fails_generation_promptly_and_the_engine_stays_dead(tiny_model):
    llm = LLM(str(tiny_model), world_size=2, **KW)
    try:
        worker = llm.engine.ranks.procs[0]
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                llm.generate(parity_prompts()[:4], SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True),
                             use_tqdm=False)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                outcome.append(exc)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        while not llm.engine.scheduler.running:  # mid-generation
            t.join(0.01)
        worker.kill()
        t.join(120)  # a hang guard, not a timing assertion: a hung engine never finishes
        assert not t.is_alive(), "generation hung after a rank died"
        assert isinstance(outcome[0], EngineDeadError)
        assert "rank" in str(outcome[0])
        with pytest.raises(EngineDeadError, match="rank 1"):  # later steps fail at once, naming the rank
            llm.generate("hello", SamplingParams(max_tokens=4), use_tqdm=False)
    finally:
        llm.shutdown()


def test_a_worker_on_another_host_joins_through_the_env_rendezvous(tiny_model, tmp_path, ref):
    """multiNodesInferEnabled: the engine waits for `mindie-service worker --rank 1` (MASTER_ADDR /
    MASTER_PORT) instead of spawning it; here both run on this host."""
    port = free_port()
    cfg = write_config(tmp_path / "config.json", tiny_model,
                       schedule={"cacheBlockSize": 16, "numKvBlocks": 256, "maxBatchSize": 16,
                                 "maxPrefillBatchSize": 16},
                       deploy={"ModelConfig": [{"modelName": "tiny", "modelWeightPath": str(tiny_model),
                                                "worldSize": 2}]})
    doc = json.loads(cfg.read_text())
    doc["BackendConfig"].update(npuDeviceIds=[[0, 1]], multiNodesInferEnabled=True, multiNodesInferPort=port)
    cfg.write_text(json.dumps(doc))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", HF_HUB_OFFLINE="1")
    worker = subprocess.Popen([sys.executable, "-m", "mindie_service", "worker", "--config", str(cfg), "--rank", "1"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        ec = load_config(cfg).engine_config()
        assert (ec.multi_node, ec.dist_port, ec.world_size) == (True, port, 2)
        with LLM(str(tiny_model), world_size=2, multi_node=True, dist_port=port, **KW) as rank0:
            assert rank0.engine.ranks.procs == []  # nothing spawned: rank 1 joined
            prompts = parity_prompts()[:4]
            assert assert_same_up_to_ties(greedy(rank0, prompts), greedy(ref, prompts)) == 0
        assert worker.wait(60) == 0  # the stop message ends it
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_worker_command_refuses_a_config_without_multi_node(tiny_model, tmp_path):
    cfg = write_config(tmp_path / "config.json", tiny_model)
    r = subprocess.run([sys.executable, "-m", "mindie_service", "worker", "--config", str(cfg), "--rank", "1"],
                       env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "multiNodesInferEnabled must be true" in r.stderr and "MASTER_ADDR" in r.stderr


def test_kv_swaps_under_preemption_run_on_every_rank(tiny_model):
    """A pool too small for the batch: the scheduler preempts and swaps K/V to the host (cpuMemSize) and
    back. Every rank swaps its own shard's blocks, so the tokens still match one rank's."""
    kw = dict(KW, num_kv_blocks=20, max_preempt_count=4, swap_space_gb=0.01)
    prompts = word_prompts(8, 20, 40, seed=5)
    one = LLM(str(tiny_model), **kw)
    want = greedy(one, prompts)
    assert one.engine.scheduler.num_swap_outs > 0  # the premise: this batch does not fit, and swaps
    with LLM(str(tiny_model), world_size=2, **kw) as two:
        got = greedy(two, prompts)
        assert two.engine.scheduler.num_swap_outs > 0 and two.engine.scheduler.num_swap_ins > 0
    assert assert_same_up_to_ties(got, want) <= 1


RANK0 = """
import sys, time
from mindie_service import LLM
llm = LLM(sys.argv[1], world_size=2, num_kv_blocks=64, cache_block_size=16, max_seq_len=512, max_batch_size=4)
print(llm.engine.ranks.procs[0].pid, flush=True)
time.sleep(600)
"""


def test_workers_exit_when_rank_0_is_killed(tiny_model):
    rank0 = subprocess.Popen([sys.executable, "-c", RANK0, str(tiny_model)], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, HF_HUB_OFFLINE="1"))
    try:
        worker_pid = int(rank0.stdout.readline())
        rank0.kill()  # no shutdown, no atexit: only the closed sockets tell the worker
        rank0.wait()
        assert wait_until(lambda: not Path(f"/proc/{worker_pid}").exists()
                          or "Z" in Path(f"/proc/{worker_pid}/stat").read_text().split()[2], timeout=60)
    finally:
        if rank0.poll() is None:
            rank0.kill()


def _async_tp(tiny_model) -> AsyncEngine:
    eng = AsyncEngine(EngineConfig(model=str(tiny_model), world_size=2, cache_block_size=16, num_kv_blocks=64,
                                   max_seq_len=512, max_batch_size=4, max_prefill_batch_size=4))
    eng.start()
    return eng


def test_the_served_engine_stops_its_worker_ranks_on_shutdown(tiny_model):
    eng = _async_tp(tiny_model)
    worker = eng.engine.ranks.procs[0]
    assert eng.healthy() and worker.is_alive()
    eng.shutdown()
    assert worker.exitcode == 0  # stopped by rank 0's stop message, not killed


def test_a_rank_that_dies_while_idle_turns_the_served_engine_unhealthy(tiny_model):
    eng = _async_tp(tiny_model)
    try:
        assert eng.healthy()
        eng.engine.ranks.procs[0].kill()  # no request in flight: the engine thread notices on its own
        assert wait_until(lambda: not eng.healthy(), timeout=30)
        assert "rank 1" in (eng.dead_reason or "")
    finally:
        eng.shutdown()
