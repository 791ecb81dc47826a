"""Multimodal chat (OpenAI image_url parts): several messages rendered by the checkpoint's processor with
its chat template, the image fetched and decoded through the media layer, ids as transformers builds them."""
from __future__ import annotations

import asyncio
import base64
import io
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image
from transformers import AutoProcessor

from mindie_service import LLM
from mindie_service.devkit import synth
from mindie_service.devkit.presets import build_demo_model
from mindie_service.inputs import ChatMessage, ChatPrompt
from mindie_service.sampling_params import SamplingParams
from multimodal import MediaItem, MediaPolicy
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def vl():
    out = ROOT / "models" / "tiny-vl"
    build_demo_model("tiny-vl", str(out), if_missing=True)
    return out


def test_multi_turn_chat_with_an_image_matches_the_processor(vl):
    png = synth.image_bytes(40, 30, "PNG")
    uri = "data:image/png;base64," + base64.b64encode(png).decode()
    prompt = ChatPrompt((ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"),
                         ChatMessage("assistant", "Hello."),
                         ChatMessage("user", ("What is in", MediaItem(0, "image", uri), "this picture?"))))
    llm = LLM(str(vl), cache_block_size=4, num_kv_blocks=256, max_seq_len=512)
    with ThreadPoolExecutor(1) as ex:
        ereq = asyncio.run(llm.input_processor.process_async(
            prompt, SamplingParams(max_tokens=2, temperature=0.0), request_id="c", truncate=None, executor=ex,
            media_policy=MediaPolicy()))
    proc = AutoProcessor.from_pretrained(str(vl))
    chat = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
            {"role": "user", "content": [{"type": "text", "text": "What is in"}, {"type": "image"},
                                         {"type": "text", "text": "this picture?"}]}]
    text = proc.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    want = proc(text=text, images=[Image.open(io.BytesIO(png)).convert("RGB")], return_tensors="pt",
                add_special_tokens=False)["input_ids"][0].tolist()
    assert list(ereq.prompt_token_ids) == want
    assert ereq.mm_inputs is not None and len(ereq.mm_hashes) == 1
