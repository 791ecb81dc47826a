"""CUDA graphs for decode steps, held without a GPU: a stand-in graph backend plays torch.cuda.CUDAGraph (a
capture records the body and its output tensor, a replay runs the body again into that same tensor, reading
whatever the static buffers hold then). Every op takes its CUDA path, the Triton kernels, run by Triton's
interpreter on CPU tensors (padded rows write to slot -1, which only the Triton KV write skips), and the logits
are held against the eager CPU path's (the C kernels), so the ops' dispatch inside the model is held too."""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.triton_interp import mend_scalar_index  # noqa: E402

pytest.importorskip("triton")
mend_scalar_index()  # triton <= 3.6 under NumPy >= 2.4 (tests/triton_interp.py)

from mindie_service.engine.runner import cuda_graphs  # noqa: E402
from mindie_service.engine.runner.cuda_graphs import GraphPlan, graph_plan  # noqa: E402
from mindie_service.engine.runner.model_runner import ModelRunner  # noqa: E402
from mindie_service.engine.step import ScheduledChunk  # noqa: E402
from mindie_service.models import fused_layers  # noqa: E402
from mindie_service.models.loader import load_model  # noqa: E402
from npu_ops import ops  # noqa: E402

BS = 4  # tokens a block


class StandInGraphs:
    def __init__(self) -> None:
        self.captured: list[tuple] = []
        self.replays = 0

    def capture(self, fn):
        out = fn()  # "captured" (the warm-up run left out): the body and where it leaves its output
        self.captured.append((fn, out))
        return len(self.captured) - 1, out

    def replay(self, graph) -> None:
        fn, out = self.captured[graph]
        out.copy_(fn())
        self.replays += 1


@pytest.fixture(scope="module")
def model(tiny_model):
    return load_model(tiny_model, "float32", torch.device("cpu"), 256).model


def _chunks(prompts: list[list[int]]) -> list[ScheduledChunk]:
    tables, nxt = [], 1
    for p in prompts:
        n = -(-(len(p) + 8) // BS)  # room for the decode steps
        tables.append(tuple(range(nxt, nxt + n)))
        nxt += n
    return [ScheduledChunk(f"r{i}", 0, tuple(p), t, True) for i, (p, t) in enumerate(zip(prompts, tables))]


def _decode(runner: ModelRunner, chunks: list[ScheduledChunk], rows: list[list[int]]) -> list[torch.Tensor]:
    """Prefill every chunk, then one decode step per entry of ``rows`` (the chunks decoding in it), greedy."""
    logits = runner._forward([], chunks, {})
    nxt = {c.request_id: int(logits[i].argmax()) for i, c in enumerate(chunks)}
    pos = {c.request_id: len(c.token_ids) for c in chunks}
    outs = []
    for step in rows:
        ds = [ScheduledChunk(chunks[i].request_id, pos[chunks[i].request_id], (nxt[chunks[i].request_id],),
                             chunks[i].block_table, True) for i in step]
        got = runner._piece(ds, [], {})
        outs.append(got.clone())
        for c, row in zip(ds, got):
            nxt[c.request_id], pos[c.request_id] = int(row.argmax()), c.start + 1
    return outs


def test_decode_steps_capture_once_per_bucket_replay_and_match_the_eager_cpu_path(model, monkeypatch):
    prompts = [[5, 9, 14, 3, 7], list(range(20, 29)), list(range(40, 46))]
    rows = [[0, 1, 2], [0, 2], [0, 1, 2]]  # buckets 4, 2, then 4 again
    eager = _decode(ModelRunner(model, 24, BS, torch.device("cpu"), torch.float32), _chunks(prompts), rows)
    monkeypatch.setattr(ops, "_triton_on", lambda t: True)  # every op on its CUDA path: Triton, interpreted
    monkeypatch.setattr(ops.cpu_kernels, "supports", lambda *ts: False)
    monkeypatch.setattr(fused_layers, "_enabled", False)  # the CPU's one-call layers: none on CUDA
    runner = ModelRunner(model, 24, BS, torch.device("cpu"), torch.float32, graphs=GraphPlan(4, 8))
    standin = runner.graphs.backend = StandInGraphs()
    runner.fused = None  # what a CUDA runner has: no C step to fall back on
    graphed = _decode(runner, _chunks(prompts), rows)
    assert {"attention", "kv_write", "rotary", "rms_norm"} <= _loaded()
    assert sorted(runner.graphs.buckets) == [2, 4] and len(standin.captured) == 2  # bucket 4 replayed, not recaptured
    assert standin.replays == runner.graphs.replays == 3
    for want, got in zip(eager, graphed):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_rows_a_graph_cannot_hold_run_eager(model):
    runner = ModelRunner(model, 24, BS, torch.device("cpu"), torch.float32, graphs=GraphPlan(4, 8))
    runner.graphs.backend = StandInGraphs()
    runner.fused = None
    lora = ScheduledChunk("a", 3, (5,), (1,), True, adapter_slot=1)
    draft = ScheduledChunk("b", 3, (5, 6, 7), (2,), True, num_draft=2)
    assert runner._fused_decode([lora]) is None and runner._fused_decode([draft]) is None
    assert not runner.graphs.takes(5, 1)  # above the largest bucket
    assert not runner.graphs.takes(2, 9)  # a context wider than the static block tables
    assert runner.graphs.replays == 0 and not runner.graphs.buckets


def _loaded() -> set[str]:
    """The Triton kernel modules the ops have imported (npu_ops/triton_<op>.py)."""
    import sys
    return {m.rpartition("triton_")[2] for m in sys.modules if m.startswith("npu_ops.triton_")}


class FakeCuda:
    type = "cuda"


def test_graph_plan_needs_cuda_the_triton_kernels_and_the_switch(monkeypatch):
    monkeypatch.setattr(cuda_graphs.triton_support, "status", {"cuda": (True, "triton 3.9.0")}.get)
    assert graph_plan(True, FakeCuda(), 50, 2560, 128) == GraphPlan(64, 20)  # maxBatchSize up to a bucket
    assert graph_plan(True, FakeCuda(), 1000, 100, 16) == GraphPlan(256, 7)  # capped at the largest bucket
    assert graph_plan(False, FakeCuda(), 50, 2560, 128) is None
    assert graph_plan(True, torch.device("cpu"), 50, 2560, 128) is None
    monkeypatch.setattr(cuda_graphs.triton_support, "status", {"cuda": (False, "triton not importable")}.get)
    assert graph_plan(True, FakeCuda(), 50, 2560, 128) is None
