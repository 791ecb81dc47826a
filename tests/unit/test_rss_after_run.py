"""What a GGUF run leaves resident once the engine is idle (issue 44: RSS <= file size + KV pool + 300 MB at the end
of a run, not only after load). A GGUF projection's threads take their temporaries (each [rows, its output rows])
from the caller's scratch (csrc/gguf_linear.c): the fused layers' dead work regions, the one-call decode step's work
for the head, one calling-thread allocation standalone. A temporary a worker thread malloc'd itself stayed resident
after its free, in that thread's glibc arena, whose top ``malloc_trim`` never gives back (SmolLM2-135M: +3.3 MB
after the first 512-token prefill, +10 MB after 16/32 streams). A model whose MLP is far wider than its attention
takes its gate/up scratch from a pad in the work (layers_f32.c's gu_pad): its fused steps still give the op-by-op
path's bits, with x quantized once per projection by the team and the tiles' panels in the work (no worker malloc
in a step's projections). The work buffer itself is a mapping of its own (``memory.scratch``): a glibc block the serve's engine
thread freed at idle would stay in its arena. Anonymous memory, counted by the kernel, not timings."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mindie_service.llm import LLM
from mindie_service.models import fused_layers
from mindie_service.sampling_params import SamplingParams
from npu_ops import cpu_kernels, gguf_cpu
from tests.gguf_files import _tokenizer, add_tensor, finish, llama_shapes, llama_writer

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")
ROOT = Path(__file__).resolve().parents[2]
# hidden 64 (2 heads of 32, 1 KV head), MLP 4096: gate/up's 8192 rows over 512 prompt rows are 16 MB of temporaries
HIDDEN, FFN, VOCAB, LAYERS, CONTEXT = 64, 4096, 2048, 2, 1024
PROMPT = 512
MB = 2**20


@pytest.fixture(scope="module")
def wide_gguf(tiny_model, tmp_path_factory) -> Path:
    """A random Llama in Q4_0 (every linear and the tied head), tiny's tokenizer (its 2048 tokens)."""
    path = tmp_path_factory.mktemp("gguf") / "wide.gguf"
    w = llama_writer(path, "wide", HIDDEN, FFN, VOCAB, LAYERS, context=CONTEXT)
    _tokenizer(w, tiny_model)
    rng = np.random.default_rng(0)
    for name, shape in llama_shapes(HIDDEN, FFN, VOCAB, LAYERS).items():
        scale = 1.0 if len(shape) == 1 else 2.0 / shape[1] ** 0.5
        data = (rng.standard_normal(shape) * scale + (1.0 if len(shape) == 1 else 0.0)).astype(np.float32)
        add_tensor(w, name, data, {name: gguf.GGMLQuantizationType.Q4_0} if len(shape) == 2 else None)
    finish(w)
    return path


def _prompt(seed: int, n: int = PROMPT) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(4, VOCAB, size=n)]


def test_a_wide_mlps_fused_steps_give_the_op_by_op_bits(wide_gguf):
    """gate/up's team scratch spans qkv, q, attention, h and the pad (the MLP is 16x the attention's width here);
    a prefill and decode steps of 1 and 8 rows, fused and op by op: the same prompt log-probs and tokens."""
    llm = LLM(str(wide_gguf), dtype="float32", max_batch_size=8, cache_block_size=16, num_kv_blocks=64,
              max_seq_len=PROMPT + 16, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, prompt_logprobs=True, logprobs=0)

    def run() -> list[tuple]:
        outs = llm.generate([_prompt(1, 300)], [params], use_tqdm=False)
        outs += llm.generate([_prompt(2 + i, 20) for i in range(8)], [params] * 8, use_tqdm=False)
        return [(o.prompt_logprobs, o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]

    rows, own = gguf_cpu.team_counts()
    fused = run()
    # the fused steps' GGUF projections: x quantized once per team (the 8-row decode), no tile call's own panels
    assert gguf_cpu.team_counts()[0] > rows and gguf_cpu.team_counts()[1] == own
    fused_layers.set_enabled(False)
    try:
        assert run() == fused
    finally:
        fused_layers.set_enabled(True)


RUN_SCRIPT = """
import json, sys, threading, torch
torch.set_num_threads(2)  # a team with a worker thread (whose arena held the temporaries), on any machine
import numpy as np
from mindie_service.llm import LLM
from mindie_service.sampling_params import SamplingParams

def anon():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) * 1024
llm = LLM(sys.argv[1], dtype="float32", max_batch_size=16, cache_block_size=16, num_kv_blocks=96, max_seq_len=600,
          enable_prefix_caching=False)
one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
rng = np.random.default_rng(0)
ids = lambda n: [int(t) for t in rng.integers(4, 2048, size=n)]
out = {}

def run():  # in a thread of its own, as the serve's engine thread: what it frees goes to its own glibc arena
    llm.generate([ids(8)], [SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)], use_tqdm=False)
    out["base"] = anon()
    for n in (int(sys.argv[2]), 400, 300):  # shrinking steps: each work buffer under the last one's mmap threshold
        llm.generate([ids(n)], [one], use_tqdm=False)
    llm.generate([ids(16) for _ in range(16)], [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)] * 16,
                 use_tqdm=False)
    out["end"] = anon()
t = threading.Thread(target=run)
t.start()
t.join()
print(json.dumps(out))
"""


def test_long_prefills_and_a_many_row_decode_leave_no_resident_temporaries(wide_gguf):
    """After a short warm-up, prefills of 512, 400 and 300 tokens and a 16-row decode, run by a thread of its own as
    the serve's engine thread: the idle engine's anonymous memory is within 2 MB of the warm-up's (the worker
    thread's temporaries held 8 MB of it for good; a work buffer from glibc, ~15 MB in the engine thread's arena)."""
    out = subprocess.run([sys.executable, "-c", RUN_SCRIPT, str(wide_gguf), str(PROMPT)], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    assert rss["end"] - rss["base"] < 2 * MB, {k: v / MB for k, v in rss.items()}
