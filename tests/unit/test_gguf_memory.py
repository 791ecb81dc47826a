"""What a GGUF serve holds after its load (issue 44: resident memory <= file size + KV pool + 300 MB, no second copy of
any weight). The tensors a loaded GGUF model references add up to the file's tensor bytes plus its RoPE tables and
the packed layers' segment tables (``SLACK``), the tied head reading the embeddings' own bytes; the engine's load
drops the GGUF reader's parse (one numpy view per vocabulary entry: ~160 MB on SmolLM2) once the model and tokenizer
have what they need; a GGUF load imports neither transformers' modeling code nor torch._dynamo (with triton and sympy,
~140 MB resident a serve never uses); and the RoPE tables computed without that code equal the families' transformers
rotary classes bit for bit. Nor does importing the engine run a tensor op, or a load draw a random init that the
checkpoint then overwrites: an op's first run faults in its kernels' code, which stays resident (~1 MB each). Counts,
not timings: ``tools/rss_breakdown.py`` measures the RSS itself."""
from __future__ import annotations

import gc
import importlib
import json
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.runner.engine_parts import load_parts
from mindie_service.models import gguf_packed, gguf_reader
from mindie_service.models.loader import load_model
from mindie_service.models.registry import REGISTRY
from mindie_service.models.rope import rope_tables
from npu_ops import cpu_kernels
from npu_ops.linear import FastLinear
from npu_ops.quant_gguf import GgufWeight
from tests import packed_checks
from tests.gguf_files import write_gguf
from tests.unit.test_gguf_packed_load import write_model

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType
ROOT = Path(__file__).resolve().parents[2]
SLACK = 2048  # segment tables (a few int64 rows per packed linear) and the like: far below one weight's bytes
Q8_LINEARS = {f"blk.{i}.{n}.weight": T.Q8_0 for i in range(4)
              for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}


def held_bytes(model: nn.Module) -> int:
    """Bytes of every tensor the model references (parameters, buffers, packed weights, tensors kept as attributes),
    each memory range once: views of one arena count by what they view, a tensor referenced twice once."""
    seen: dict[int, int] = {}

    def add(t: object) -> None:
        if isinstance(t, GgufWeight):
            t = t.data
        if isinstance(t, torch.Tensor) and not t.is_meta:
            seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.numel() * t.element_size())

    for m in model.modules():
        for v in (*m._parameters.values(), *m._buffers.values(), *vars(m).values()):
            for t in (v if isinstance(v, (list, tuple)) else [v]):
                add(t)
    return sum(seen.values())


@pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_a_loaded_gguf_holds_each_weight_once(tmp_path, qtype):
    f = write_model(tmp_path / f"{qtype}.gguf", T[qtype])
    file_bytes = sum(int(t.n_bytes) for t in gguf_reader.read_gguf(f).tensors)
    m = load_model(f, "float32", torch.device("cpu"), 128).model
    packed_checks.all_packed(m)
    assert m.lm_head.parts[0].data.data_ptr() == m.embed_tokens.weight_q.data.data_ptr()  # the tied head: its bytes
    rope = 2 * m.rope_cos.numel() * m.rope_cos.element_size()
    held = held_bytes(m)
    assert file_bytes + rope <= held <= file_bytes + rope + SLACK, (held, file_bytes, rope)
    weights = {w.data.data_ptr() for w in gguf_packed.packed_weights(m)}
    assert len(weights) == len(gguf_packed.packed_weights(m))  # no two packed weights over the same bytes


@pytest.fixture(scope="module")
def tiny_q8(tiny_model, tmp_path_factory) -> Path:
    return write_gguf(tiny_model, tmp_path_factory.mktemp("gguf") / "tiny-q8.gguf", types=Q8_LINEARS)


def test_the_engine_load_drops_the_gguf_parse(tiny_q8):
    reader = weakref.ref(gguf_reader.read_gguf(tiny_q8))  # parsed once: the load below reuses it
    parts = load_parts(EngineConfig(model=str(tiny_q8), max_seq_len=64, max_batch_size=2, num_kv_blocks=8))
    assert parts.tokenizer is not None and parts.loaded.weights_report["Q8_0"].endswith("kept packed")
    gc.collect()
    assert reader() is None, "the GGUF reader outlived the load (its parse stays in the RSS)"


LOAD_SCRIPT = """
import json, sys
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.runner.engine_parts import load_parts
load_parts(EngineConfig(model=sys.argv[1], max_seq_len=64, max_batch_size=2, num_kv_blocks=8))
print(json.dumps(sorted(m for m in sys.argv[2:] if m in sys.modules)))
"""
HEAVY = ("torch._dynamo", "triton", "transformers.models.llama.modeling_llama",
         "transformers.models.llama.configuration_llama", "torch.distributed.tensor", "sympy")


def test_a_gguf_load_imports_no_modeling_or_compiler_code(tiny_q8):
    """Nor transformers' config classes (models/gguf_config.py) or torch.fx's symbolic shapes (loader.to_empty)."""
    out = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(tiny_q8), *HEAVY], capture_output=True, text=True,
                         cwd=ROOT, check=True, timeout=300)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


# transformers' GGUF integration: its config reading and its tokenizer builders (with six families' tokenizer classes)
GGUF_INTEGRATION = ("transformers.modeling_gguf_pytorch_utils", "transformers.integrations.ggml",
                    "transformers.integrations.gguf.gguf_tokenizer_mapping", "transformers.integrations.gguf.reader",
                    "transformers.models.gpt2.tokenization_gpt2", "transformers.models.t5.tokenization_t5")


def test_a_llama_gguf_load_builds_its_config_and_tokenizer_without_transformers_gguf_code(tiny_q8):
    """models/gguf_config.raw_config and models/gguf_tokenizer.py read the metadata from our own parse."""
    out = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(tiny_q8), *GGUF_INTEGRATION], capture_output=True,
                         text=True, cwd=ROOT, check=True, timeout=300)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


ROPE_TYPES = [None, {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
              {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 500000.0},
              {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0},
              {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}]


@pytest.mark.parametrize("rotary_class", sorted({f.rotary_class for f in REGISTRY.values()}))
@pytest.mark.parametrize("rope", ROPE_TYPES, ids=lambda r: (r or {}).get("rope_type", "default"))
def test_rope_tables_equal_the_transformers_rotary_class(rotary_class, rope):
    from transformers import AutoConfig
    mod_name, cls_name = rotary_class.rsplit(".", 1)
    model_type = mod_name.split(".")[-2]
    kw = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              intermediate_size=128, num_hidden_layers=1, vocab_size=100)
    cfg = AutoConfig.for_model(model_type, **kw, **({"rope_parameters": rope} if rope else {}))
    ref = getattr(importlib.import_module(mod_name), cls_name)(config=cfg)
    cos, sin = ref(torch.zeros(1), torch.arange(300)[None])
    got_cos, got_sin = rope_tables(rotary_class, cfg, 300)
    assert torch.equal(got_cos, cos[0]) and torch.equal(got_sin, sin[0])


class OpLog(TorchDispatchMode):
    """The aten ops run while it is active (factories, meta tensors and views included)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


IMPORT_SCRIPT = """
import json, torch
from torch.utils._python_dispatch import TorchDispatchMode
ops = []
class OpLog(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ops.append(str(func))
        return func(*args, **(kwargs or {}))
with OpLog():
    import mindie_service.llm, mindie_service.server.main
print(json.dumps(ops))
"""


def test_importing_the_engine_runs_no_tensor_op():
    """The structured-output bit table (grammar_masks) waits for the first mask: its shift and and ops ran at import
    in every serve, structured output or not."""
    out = subprocess.run([sys.executable, "-c", IMPORT_SCRIPT], capture_output=True, text=True, cwd=ROOT, check=True,
                         timeout=300)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_allowed_bits_unpacks_each_word_low_bit_first():
    from mindie_service.engine.sample.grammar_masks import allowed_bits
    masks = torch.tensor([[0b101, -2**31], [0, 1]], dtype=torch.int32)  # row 0: tokens 0, 2 and 63; row 1: 32
    want = torch.zeros(2, 70, dtype=torch.bool)
    want[0, [0, 2, 63]] = want[1, 32] = True
    assert torch.equal(allowed_bits(masks, 70), want) and torch.equal(allowed_bits(masks, 40), want[:, :40])


def test_a_gguf_load_draws_no_random_init(tiny_q8):
    """The model is built on the meta device and every weight then comes from the file; a linear built for real
    still draws nn.Linear's init."""
    with OpLog() as log:
        load_model(tiny_q8, "float32", torch.device("cpu"), 64)
    assert not [op for op in log.ops if "uniform_" in op or "normal_" in op]
    torch.manual_seed(0)
    lin = FastLinear(64, 64)
    bound = 64 ** -0.5  # kaiming_uniform_(a=sqrt(5)) and the bias's: U(-1/sqrt(in), 1/sqrt(in))
    assert 0.5 * bound < lin.weight.abs().max() <= bound and 0.5 * bound < lin.bias.abs().max() <= bound
