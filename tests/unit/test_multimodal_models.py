"""Multimodal checkpoints (tiny-vl = LLaVA, tiny-audio = Qwen2-Audio): our engine runs the language model
over the paged cache with media embeddings spliced in, and its greedy output is token-identical to the
transformers class on the same weights, processor and prompt."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from transformers import AutoProcessor

from mindie_service import LLM, SamplingParams
from mindie_service.inputs import PartsPrompt
from mindie_service.engine.contract import EngineRequest
from mindie_service.devkit.presets import build_demo_model
from mindie_service.errors import ValidationError

ROOT = Path(__file__).resolve().parents[2]
N = 24
GREEDY = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)


def _build(preset: str) -> Path:
    return build_demo_model(preset, str(ROOT / "models" / preset), if_missing=True)


@pytest.fixture(scope="module")
def vl() -> Path:
    return _build("tiny-vl")


@pytest.fixture(scope="module")
def audio() -> Path:
    return _build("tiny-audio")


def _image(seed: int, size: tuple[int, int] = (40, 50)) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(*size, 3) * 255).astype(np.uint8))


def _tone(freq: float, seconds: float) -> np.ndarray:
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


class Reference:
    """transformers' own class + processor on one prompt (one user message, parts in order)."""

    def __init__(self, path: Path) -> None:
        self.proc = AutoProcessor.from_pretrained(str(path))
        arch = json.loads((path / "config.json").read_text())["architectures"][0]
        self.model = getattr(transformers, arch).from_pretrained(str(path), dtype=torch.float32).eval()

    @torch.inference_mode()
    def generate(self, content: list[dict], images: list | None = None, audios: list | None = None) -> list[int]:
        text = self.proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False)
        kw: dict = {"text": text, "return_tensors": "pt", "add_special_tokens": False}
        if images:
            kw["images"] = images
        if audios:
            kw["audio"], kw["sampling_rate"] = audios, 16000
        inp = self.proc(**kw)
        inp.pop("num_audio_tokens", None)
        out = self.model.generate(**inp, max_new_tokens=N, min_new_tokens=N, do_sample=False,
                                  pad_token_id=self.proc.tokenizer.pad_token_id)
        return out[0, inp["input_ids"].shape[1]:].tolist()


@pytest.fixture(scope="module")
def vl_ref(vl) -> Reference:
    return Reference(vl)


@pytest.fixture(scope="module")
def vl_llm(vl) -> LLM:
    return LLM(str(vl), cache_block_size=4, num_kv_blocks=512, max_seq_len=512)


def _ids(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


# ------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize("preset", ["tiny-vl", "tiny-audio"])
def test_demo_checkpoints_are_deterministic_and_load_in_transformers(preset, tmp_path, vl, audio):
    ref_dir = {"tiny-vl": vl, "tiny-audio": audio}[preset]
    again = build_demo_model(preset, tmp_path / preset)
    names = sorted(f.name for f in ref_dir.iterdir())
    assert names == sorted(f.name for f in again.iterdir())
    for name in names:
        assert (ref_dir / name).read_bytes() == (again / name).read_bytes(), name
    proc = AutoProcessor.from_pretrained(str(ref_dir))
    assert "token_type_ids" not in proc.tokenizer("hello there")
    arch = json.loads((ref_dir / "config.json").read_text())["architectures"][0]
    _, info = getattr(transformers, arch).from_pretrained(str(ref_dir), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


# ------------------------------------------------------------------ LLaVA
@pytest.fixture(scope="module")
def vl_batch(vl_ref):
    """Image, video (3 frames = 3 image parts in its place), text-only and image-last prompts with
    transformers' greedy output for each."""
    img, other = _image(0), _image(1, (64, 48))
    frames = [np.asarray(_image(10 + i)) for i in range(3)]
    q = {"type": "text", "text": "What is in the picture?"}
    story = {"type": "text", "text": "Tell me a story about a river."}
    prompts = [
        {"parts": [{"type": "image", "image": img}, q]},
        {"parts": [{"type": "text", "text": "Compare"}, {"type": "video", "video": frames}, q]},
        {"parts": [story]},
        {"parts": [q, {"type": "image", "image": other}]},
    ]
    want = [
        vl_ref.generate([{"type": "image"}, q], images=[img]),
        vl_ref.generate([{"type": "text", "text": "Compare"}] + [{"type": "image"}] * 3 + [q],
                        images=[Image.fromarray(f) for f in frames]),
        vl_ref.generate([story]),
        vl_ref.generate([q, {"type": "image"}], images=[other]),
    ]
    return prompts, want


def test_image_and_video_requests_match_transformers_in_one_batch(vl_llm, vl_batch):
    prompts, want = vl_batch
    got = _ids(vl_llm.generate(prompts + ["Plain text prompts still work"], GREEDY, use_tqdm=False))
    assert got[:4] == want
    assert got[0] != got[3]  # the media moves the output (guards against a degenerate demo model)
    assert vl_llm.engine.stats().free_blocks == 512
    # Alone, a request gives what it gave in the batch.
    assert _ids(vl_llm.generate(prompts[1], GREEDY, use_tqdm=False)) == [want[1]]


def test_media_requests_match_transformers_under_preemption(vl, vl_batch):
    prompts, want = vl_batch
    # 24 blocks of 4 tokens cannot hold 4 sequences of ~40-100 tokens: the scheduler must preempt and
    # recompute, splicing the (kept) media embeddings in again.
    llm = LLM(str(vl), cache_block_size=4, num_kv_blocks=40, max_seq_len=150, max_input_token_len=120,
              max_prefill_tokens=150, max_batch_size=4)
    assert _ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == want
    assert llm.engine.stats().num_preemptions > 0
    assert llm.engine.stats().free_blocks == 40


def test_media_requests_match_transformers_with_chunked_prefill(vl, vl_batch):
    # 7 prompt tokens a step: every image's placeholders straddle several chunks, and each chunk splices
    # in only the embeddings of the placeholders it holds.
    prompts, want = vl_batch
    llm = LLM(str(vl), cache_block_size=4, num_kv_blocks=256, max_seq_len=150, max_input_token_len=120,
              max_prefill_tokens=7, max_batch_size=4)
    assert _ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == want
    assert llm.engine.stats().free_blocks == 256


def test_media_layer_parts_are_accepted(vl_llm, vl_batch):
    from multimodal import LoadedPart

    prompts, want = vl_batch
    img = prompts[0]["parts"][0]["image"]
    parts = [LoadedPart(0, "image", img, "f" * 64, "png"),
             LoadedPart(1, "text", "What is in the picture?", "0" * 64)]
    mp = vl_llm.engine.mm_encoder.prepare(parts)
    assert mp.mm_hashes == ("f" * 64,)
    assert _ids(vl_llm.generate({"parts": parts}, GREEDY, use_tqdm=False)) == [want[0]]


def _run_one(llm: LLM, rid: str, parts: list[dict]) -> tuple[list[int], int]:
    """Run one request through the engine; returns its tokens and how many prompt tokens hit the prefix cache."""
    eng = llm.engine
    mp = eng.mm_encoder.prepare(parts)
    seq = eng.add_request(EngineRequest(rid, mp.prompt_token_ids, GREEDY, mm_inputs=mp.mm_inputs,
                                        mm_hashes=mp.mm_hashes))
    toks: list[int] = []
    cached = None
    while eng.has_work():
        for ev in eng.step():
            if cached is None:
                cached = seq.num_cached_tokens
            toks.append(ev.token.id)
    return toks, cached or 0


def test_prefix_cache_is_shared_only_with_identical_media(vl, vl_ref):
    llm = LLM(str(vl), cache_block_size=4, num_kv_blocks=256, max_seq_len=512)
    img, other = _image(3), _image(4)
    a = [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]
    b = [{"type": "image"}, {"type": "text", "text": "Describe the colors."}]
    parts = lambda content, im: [dict(p, image=im) if p["type"] == "image" else p for p in content]  # noqa: E731
    first, cached = _run_one(llm, "a", parts(a, img))
    assert cached == 0 and first == vl_ref.generate(a, images=[img])
    # Same image, other question: the blocks up to the question (image tokens included) are reused.
    second, cached = _run_one(llm, "b", parts(b, img))
    assert cached >= 20 and second == vl_ref.generate(b, images=[img])
    # Same tokens as the first request, other image: nothing may be shared, and the output is the cold one.
    third, cached = _run_one(llm, "c", parts(a, other))
    assert cached == 0 and third == vl_ref.generate(a, images=[other])
    # The first request again: a cached run gives the cold output.
    again, cached = _run_one(llm, "d", parts(a, img))
    assert cached > 0 and again == first


def test_placeholders_without_media_are_refused(vl_llm, tiny_model):
    with pytest.raises(ValidationError, match="placeholder"):
        vl_llm.generate("Look at <image> please", GREEDY, use_tqdm=False)
    with pytest.raises(ValidationError, match="placeholder"):
        vl_llm.generate({"parts": [{"type": "text", "text": "<image> here"}]}, GREEDY, use_tqdm=False)
    with pytest.raises(ValidationError, match="media type"):
        vl_llm.generate({"parts": [{"type": "audio", "audio": _tone(440, 1.0)}]}, GREEDY, use_tqdm=False)
    # Placeholders are never cut: truncate with media, and a media prompt over the limit even with
    # truncation on, are refused by the input processor (nothing reaches the engine).
    parts = PartsPrompt(({"type": "image", "image": _image(0)}, {"type": "text", "text": "What is this?"}))
    with pytest.raises(ValidationError, match="truncate"):
        vl_llm.input_processor.process(parts, GREEDY, request_id="cut", truncate=5)
    short = LLM(str(vl_llm.engine.cfg.model), cache_block_size=16, num_kv_blocks=64, max_input_token_len=20,
                truncation=True)
    with pytest.raises(ValidationError, match="at most 20 tokens"):
        short.input_processor.process(parts, GREEDY, request_id="long")
    assert not vl_llm.engine.has_work() and not short.engine.has_work()
    text_llm = LLM(str(tiny_model), cache_block_size=16, num_kv_blocks=64)
    with pytest.raises(ValidationError, match="media"):
        text_llm.generate({"parts": [{"type": "text", "text": "hi"}]}, GREEDY, use_tqdm=False)


# ------------------------------------------------------------------ Qwen2-Audio
def test_audio_requests_match_transformers_in_one_batch(audio):
    ref = Reference(audio)
    llm = LLM(str(audio), cache_block_size=8, num_kv_blocks=256, max_seq_len=512)
    short, long_, other = _tone(440, 0.5), _tone(660, 1.5), _tone(1000, 1.0)
    q = {"type": "text", "text": "What is that sound?"}
    prompts = [
        {"parts": [{"type": "audio", "audio": other, "sampling_rate": 16000}, q]},
        {"parts": [{"type": "audio", "audio": short}, {"type": "text", "text": "and"},
                   {"type": "audio", "audio": long_}, q]},
        {"parts": [{"type": "text", "text": "Tell me a story about a river."}]},
        {"parts": [q, {"type": "audio", "audio": _tone(220, 1.0)}]},
    ]
    got = _ids(llm.generate(prompts, GREEDY, use_tqdm=False))
    want = [
        ref.generate([{"type": "audio"}, q], audios=[other]),
        ref.generate([{"type": "audio"}, {"type": "text", "text": "and"}, {"type": "audio"}, q],
                     audios=[short, long_]),
        ref.generate([{"type": "text", "text": "Tell me a story about a river."}]),
        ref.generate([q, {"type": "audio"}], audios=[_tone(220, 1.0)]),
    ]
    assert got == want
    assert got[0] != got[3]
    with pytest.raises(ValidationError, match="placeholder"):
        llm.generate("hear <|AUDIO|> this", GREEDY, use_tqdm=False)
