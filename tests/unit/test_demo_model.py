"""The demo-model builder: determinism, transformers compatibility, tokenizer behaviour, build versions."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mindie_service.devkit import presets  # noqa: E402
from mindie_service.devkit.presets import PRESETS, build_demo_model, get_preset  # noqa: E402
from mindie_service.devkit.text_model import BOS_ID, EOS_ID, PAD_ID, TINY, param_count  # noqa: E402

EXPECTED_FILES = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "generation_config.json", presets.MARKER}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model("tiny", tmp_path_factory.mktemp("demo") / "tiny")


def _files(d: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(d.iterdir())}


def test_files_and_no_leftovers(tiny: Path) -> None:
    assert {f.name for f in tiny.iterdir()} == EXPECTED_FILES
    assert [p.name for p in tiny.parent.iterdir()] == ["tiny"]  # temp build folder is gone


def test_two_builds_are_byte_identical(tiny: Path, tmp_path: Path) -> None:
    again = build_demo_model("tiny", tmp_path / "again")
    assert _files(again) == _files(tiny)


def test_config(tiny: Path) -> None:
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["torch_dtype"] == "float32"
    assert cfg["vocab_size"] == TINY.vocab_size == 2048
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (BOS_ID, EOS_ID, PAD_ID)
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]  # GQA


def test_transformers_loads_and_generates(tiny: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    n = sum(p.numel() for p in model.parameters())
    assert n == param_count(TINY)
    assert 1.2e6 < n < 1.4e6
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()  # untied
    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    ids = tok("The quick brown fox", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
        out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=PAD_ID)
    assert 2.0 < logits.std().item() < 8.0  # far from uniform: greedy argmax is stable
    new = out[0, ids.shape[1]:].tolist()
    assert len(set(new)) > 3  # not one token repeated


@pytest.mark.parametrize("text", [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "今天天气很好，我们一起去公园散步吧。量子计算机",
    "Party 🎉🦄 time 👩\u200d👩\u200d👧 ok",
    "  leading spaces\nnew line\ttab",
])
def test_tokenizer_round_trip_and_bos(tiny: Path, text: str) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    ids = tok(text).input_ids
    assert ids[0] == BOS_ID and ids.count(BOS_ID) == 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text


def test_tokenizer_specials_and_byte_splitting(tiny: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    assert len(tok) == TINY.vocab_size
    assert [tok.convert_tokens_to_ids(t) for t in ("<unk>", "<s>", "</s>", "<pad>")] == [0, 1, 2, 3]
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == ("<s>", "</s>", "<pad>", "<unk>")
    # CJK characters and emoji span several byte-level tokens (exercises incremental detokenizing).
    for ch in ("量", "🦄"):
        assert len(tok(ch, add_special_tokens=False).input_ids) > 1


def test_chat_template(tiny: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<s><|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"
    assert not tok.apply_chat_template(msgs, tokenize=False).endswith("<|assistant|>\n")
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids[0] == BOS_ID and ids.count(BOS_ID) == 1


def test_if_missing_keeps_existing_checkpoint(tiny: Path, tmp_path: Path) -> None:
    out = build_demo_model("tiny", tmp_path / "m")
    before = _files(out)
    assert build_demo_model("tiny", out, seed=1, if_missing=True) == out
    assert _files(out) == before
    # Without if_missing it rebuilds in place (new seed -> new weights, same tokenizer),
    # leaving files it does not own alone.
    (out / "notes.txt").write_text("keep me")
    build_demo_model("tiny", out, seed=1)
    after = _files(out)
    assert after["model.safetensors"] != before["model.safetensors"]
    assert after["tokenizer.json"] == before["tokenizer.json"]
    assert after["notes.txt"] == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_unknown_preset(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown demo preset"):
        build_demo_model("huge", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_one_registry_holds_text_and_multimodal_presets() -> None:
    assert {"tiny", "small", "tiny-vl", "tiny-audio"} <= set(PRESETS)
    assert get_preset("tiny").shape == TINY and get_preset("tiny").kind == "text"
    assert get_preset("tiny-vl").kind == get_preset("tiny-audio").kind == "multimodal"
    with pytest.raises(ValueError, match="tiny-audio"):  # the message lists every choice
        get_preset("huge")


def test_build_records_preset_seed_and_devkit_version(tiny: Path) -> None:
    marker = json.loads((tiny / presets.MARKER).read_text())
    assert marker == {"devkit_version": presets.build_version(), "preset": "tiny", "seed": 0}
    assert presets.is_current(tiny)


def test_if_missing_rebuilds_a_folder_from_another_devkit_version(tiny: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    out = build_demo_model("tiny", tmp_path / "m")
    fresh = _files(out)
    # A folder an older builder made: the same files, another recorded version, stale weights.
    marker = json.loads((out / presets.MARKER).read_text())
    (out / presets.MARKER).write_text(json.dumps({**marker, "devkit_version": "0.old"}))
    (out / "model.safetensors").write_bytes(b"stale")
    assert not presets.is_current(out)
    assert build_demo_model("tiny", out, if_missing=True) == out
    assert _files(out) == fresh and presets.is_current(out)
    # A builder change moves the current version: the folder just built is stale for it.
    presets.build_version.cache_clear()
    monkeypatch.setattr(presets, "FORMAT", presets.FORMAT + 1)
    try:
        assert not presets.is_current(out)
        stamp = (out / "model.safetensors").stat().st_mtime_ns
        build_demo_model("tiny", out, if_missing=True)
        assert (out / "model.safetensors").stat().st_mtime_ns != stamp
        assert json.loads((out / presets.MARKER).read_text())["devkit_version"].startswith(f"{presets.FORMAT}.")
    finally:
        monkeypatch.undo()
        presets.build_version.cache_clear()


def test_if_missing_rebuilds_a_checkpoint_without_a_marker(tmp_path: Path) -> None:
    """Folders built before build versions existed carry no marker: they count as stale."""
    out = build_demo_model("tiny", tmp_path / "m")
    (out / presets.MARKER).unlink()
    (out / "model.safetensors").write_bytes(b"stale")
    build_demo_model("tiny", out, if_missing=True)
    assert presets.is_current(out) and (out / "model.safetensors").read_bytes() != b"stale"


def test_cli_builds_and_skips_a_current_folder(tmp_path: Path) -> None:
    from mindie_service.cli import main

    out = tmp_path / "cli"
    assert main(["demo-model", "--preset", "tiny", "--out", str(out), "--if-missing"]) == 0
    assert presets.is_current(out)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert main(["demo-model", "--preset", "tiny", "--out", str(out), "--if-missing"]) == 0
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_cli_names_an_unknown_preset_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mindie_service.cli import main

    assert main(["demo-model", "--preset", "huge", "--out", str(tmp_path / "x")]) == 2
    assert "unknown demo preset 'huge'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
