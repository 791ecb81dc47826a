"""What a serve does not build before it needs it (issue 44: resident memory after load <= file + KV pool + 300 MB).
llguidance's token table (~30 MB on SmolLM2's vocabulary) is built by the first structured request, once, whatever
threads ask at once, and that request's output is what a prebuilt table gives; a build that fails refuses structured
requests by name. A GGUF model has one tokenizer object: every load of the file while one is held returns it, the
async facade's frontend uses the engine's own, and nothing keeps it once its holders are gone. A llama GGUF's config
is our own dataclass, equal to transformers' config class on every field it has, and its tokenizer is the one
AutoTokenizer gives, both without importing transformers' config classes (the import itself is checked in
test_gguf_memory.py). A run's fused-layer work buffer (sized by its largest step) and freed heap are given back when
the engine runs out of work, offline and in the serve's engine thread. Counts and identities,
not timings: ``tools/rss_breakdown.py`` measures the RSS itself."""
from __future__ import annotations

import asyncio
import gc
import json
import logging
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import fields
from pathlib import Path

import pytest

from mindie_service.engine.async_engine import AsyncEngine
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.errors import ValidationError
from mindie_service.inputs import InputProcessor, TextPrompt
from mindie_service.llm import LLM
from mindie_service.models import gguf_checkpoint
from mindie_service.models.fused_layers import FusedLayers
from mindie_service.models.gguf_config import GgufConfig, light_config
from mindie_service.sampling_params import SamplingParams
from mindie_service.structured.compiler import LazyBackend
from npu_ops import cpu_kernels
from tests.gguf_files import write_gguf

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["n", "ok"],
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}}}


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model, tmp_path_factory) -> Path:
    return write_gguf(tiny_model, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


START_SCRIPT = """
import json, sys
from mindie_service.engine.async_engine import AsyncEngine
from mindie_service.engine.configs.engine_config import EngineConfig
eng = AsyncEngine(EngineConfig(model=sys.argv[1], max_seq_len=64, max_batch_size=2, max_prefill_batch_size=2, max_iter_times=32,
                               num_kv_blocks=8))
core = eng.engine
print(json.dumps({"llguidance imported": "llguidance" in sys.modules, "table built": core.grammar.compiler.backend.built,
                  "frontend tokenizer is the engine's": eng.tokenizer is core.tokenizer
                  and eng.input_facts.tokenizer is core.tokenizer}))
"""


def test_an_engine_start_builds_no_token_table_and_one_tokenizer(tiny_gguf):
    out = subprocess.run([sys.executable, "-c", START_SCRIPT, str(tiny_gguf)], capture_output=True, text=True,
                         cwd=ROOT, check=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"llguidance imported": False, "table built": False, "frontend tokenizer is the engine's": True}


def test_the_first_structured_request_builds_the_table_and_gets_what_a_built_one_gives(tiny_model, caplog):
    llm = LLM(str(tiny_model))
    backend = llm.engine.grammar.compiler.backend
    assert not backend.built
    p = SamplingParams(max_tokens=200, temperature=0.0, structured_outputs={"json": SCHEMA})
    with caplog.at_level(logging.INFO, logger="mindie_service.structured.compiler"):
        first = llm.generate(["Hello"], p, use_tqdm=False)[0].outputs[0]
    assert backend.built and any("token table" in r.getMessage() for r in caplog.records)
    again = llm.generate(["Hello"], p, use_tqdm=False)[0].outputs[0]
    assert first.token_ids == again.token_ids and first.finish_reason == "eos_token"
    assert isinstance(json.loads(first.text)["n"], int)


def test_threads_asking_at_once_build_the_backend_once():
    builds: list[int] = []
    gate = threading.Barrier(8)

    def build() -> object:
        builds.append(1)
        time.sleep(0.05)  # a build takes a while: the other threads arrive while it runs
        return object()

    lazy = LazyBackend(build, "fake")
    got: list[object] = []

    def ask() -> None:
        gate.wait()
        got.append(lazy.get("response_format"))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(got) == 8 and len({id(b) for b in got}) == 1


def test_a_backend_that_cannot_be_built_refuses_structured_requests_by_name(caplog):
    builds: list[int] = []

    def build() -> object:
        builds.append(1)
        raise ValueError("Only fast tokenizers are supported")

    lazy = LazyBackend(build, "llguidance")
    with caplog.at_level(logging.WARNING, logger="mindie_service.structured.compiler"):
        for _ in range(2):
            with pytest.raises(ValidationError, match=r"Parameter response_format must be absent: structured output "
                                                      r"is off .*Only fast tokenizers"):
                lazy.get("response_format")
    assert len(builds) == 1 and sum("structured output is off" in r.getMessage() for r in caplog.records) == 1


def test_a_gguf_tokenizer_is_one_object_while_held_and_freed_after(tiny_gguf):
    tok = gguf_checkpoint.load_tokenizer(tiny_gguf)
    assert gguf_checkpoint.load_tokenizer(tiny_gguf.parent) is tok  # the folder holding the file: the same object
    other = gguf_checkpoint.load_tokenizer(tiny_gguf, chat_template="{{ messages[0]['content'] }}")
    assert other is not tok and tok.chat_template != other.chat_template  # a template override is its own object
    gone = weakref.ref(tok)
    del tok, other
    gc.collect()
    assert gone() is None, "the tokenizer outlived its holders (a cache keeps it resident)"


def test_a_llama_gguf_config_and_tokenizer_equal_what_transformers_builds(tiny_gguf):
    from transformers import AutoConfig, AutoTokenizer
    ours = gguf_checkpoint.open_checkpoint(tiny_gguf).hf_config
    assert isinstance(ours, GgufConfig)
    ref = AutoConfig.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    assert {f.name: getattr(ours, f.name) for f in fields(GgufConfig)} == \
        {f.name: getattr(ref, f.name) for f in fields(GgufConfig)}
    tok = gguf_checkpoint.load_tokenizer(tiny_gguf)
    want = AutoTokenizer.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    text = f"{want.bos_token}Hello, world!{want.eos_token} caf\u00e9  42\n"
    assert type(tok) is type(want) and tok.init_kwargs == want.init_kwargs
    assert tok(text).input_ids == want(text).input_ids and tok.all_special_ids == want.all_special_ids
    assert tok.chat_template == want.chat_template and len(tok) == len(want)


def test_a_config_ours_does_not_cover_goes_to_transformers():
    raw = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4}
    got = light_config(raw)
    assert got is not None and (got.num_key_value_heads, got.head_dim) == (4, 8)  # LlamaConfig's defaults
    assert got.rope_parameters == {"rope_theta": 10000.0, "rope_type": "default"}
    assert light_config({**raw, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}) is None
    assert light_config({**raw, "model_type": "qwen2"}) is None
    assert light_config({k: v for k, v in raw.items() if k != "vocab_size"}) is None


def _fused_work(llm_engine) -> int:
    fused = getattr(llm_engine.model, "_fused_layers", None)
    assert fused is not None, "the fused layers never ran: nothing here checks their release"
    return fused.work.numel()


@pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")
def test_a_run_gives_its_work_buffer_back_when_the_engine_goes_idle(tiny_model, monkeypatch):
    llm = LLM(str(tiny_model), max_batch_size=8, max_prefill_batch_size=8)
    peak: list[int] = []
    scratch = FusedLayers.scratch
    monkeypatch.setattr(FusedLayers, "scratch", lambda self, n: peak.append(n) or scratch(self, n))
    p = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    first = llm.generate([f"prompt number {i} about rivers and hills" for i in range(8)], p, use_tqdm=False)
    assert peak and _fused_work(llm.engine) == 0  # the buffer the steps used is gone once generate returns
    again = llm.generate([f"prompt number {i} about rivers and hills" for i in range(8)], p, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in first]


@pytest.mark.skipif(cpu_kernels.load() is None, reason="no C kernels here")
def test_the_serve_engine_thread_gives_it_back_when_it_runs_out_of_work(tiny_model):
    eng = AsyncEngine(EngineConfig(model=str(tiny_model), cache_block_size=16, num_kv_blocks=64, max_batch_size=4,
                                   max_prefill_batch_size=4))
    eng.start()
    try:
        req = InputProcessor.from_facts(eng.input_facts).process(
            TextPrompt("River mountain city garden"), SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
            request_id="r")

        async def main() -> list[int]:
            return [ev.token.id async for ev in eng.generate(req)]

        assert len(asyncio.run(main())) == 6
        for _ in range(3000):  # a hang guard: the engine thread releases right after delivering the last event
            if _fused_work(eng.engine) == 0:
                break
            time.sleep(0.01)
        assert _fused_work(eng.engine) == 0
    finally:
        eng.shutdown()


def test_an_offline_engine_gives_back_what_its_build_freed_before_it_returns(tiny_model, monkeypatch):
    # What the engine's and the input processor's builds allocate and free (~9 MB on SmolLM2) stays in the RSS
    # until glibc trims: the last thing LLM() does is a trim, after the input processor is built.
    from npu_ops import memory
    events: list[str] = []
    trim, build = memory.trim_heap, InputProcessor.from_facts
    monkeypatch.setattr(memory, "trim_heap", lambda: events.append("trim") or trim())
    monkeypatch.setattr(InputProcessor, "from_facts", staticmethod(lambda *a, **k: events.append("processor")
                                                                   or build(*a, **k)))
    LLM(str(tiny_model), num_kv_blocks=16)
    assert "processor" in events and events[-1] == "trim", events


def test_the_serve_engine_thread_gives_it_back_before_the_first_request(tiny_model):
    eng = AsyncEngine(EngineConfig(model=str(tiny_model), cache_block_size=16, num_kv_blocks=16, max_batch_size=2,
                                   max_prefill_batch_size=2))
    calls = threading.Event()
    idle = eng.engine.runner.idle
    eng.engine.runner.idle = lambda: (calls.set(), idle())  # type: ignore[method-assign]
    eng.start()
    try:
        assert calls.wait(timeout=60), "the engine thread waited for work with the load's freed heap still held"
    finally:
        eng.shutdown()
