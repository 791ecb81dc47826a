"""POST / with MindIE's list inputs against the real server: image, video and audio from a local
folder, a data: URI and a loopback URL; every refusal a 4xx that leaves the server healthy."""
from __future__ import annotations

import base64
import functools
import http.server
import io
import os
import threading
from pathlib import Path

import pytest
from PIL import Image

from mindie_service import LLM, SamplingParams
from mindie_service.devkit.presets import build_demo_model
from mindie_service.devkit import synth
from tests.server_utils import ROOT, ServerProcess, free_port, shared_server, plain_server, sse_frames, write_config

GREEDY = {"max_new_tokens": 12, "do_sample": False}


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("media")
    (d / "allowed").mkdir()
    (d / "allowed" / "cat.png").write_bytes(synth.image_bytes(40, 30, "PNG"))
    (d / "allowed" / "clip.mp4").write_bytes(synth.video_bytes(num_frames=10, size=32, fmt="mp4"))
    (d / "allowed" / "fake.mp4").write_bytes(synth.image_bytes(16, 16, "PNG"))  # a PNG renamed .mp4
    (d / "allowed" / "cut.jpg").write_bytes(synth.image_bytes(64, 64, "JPEG")[:300])  # truncated JPEG
    (d / "allowed" / "tone.wav").write_bytes(synth.audio_bytes(1.0, rate=16000, fmt="WAV"))
    (d / "secret.png").write_bytes(synth.image_bytes(8, 8, "PNG"))
    os.symlink(d / "secret.png", d / "allowed" / "link.png")
    return d


class _MediaHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the folder; /redirect answers 302 to a metadata address, /huge.png streams 21 MB."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data")
            self.end_headers()
        elif self.path == "/huge.png":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            chunk = synth.image_bytes(8, 8, "PNG") + b"\0" * (1 << 20)
            try:
                for _ in range(21):
                    self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
        else:
            super().do_GET()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def media_url(media_dir):
    """A loopback HTTP server for the media folder (the tests turn allowPrivateMediaUrls on for it)."""
    handler = functools.partial(_MediaHandler, directory=str(media_dir / "allowed"))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _mm_server(request, preset: str, media_dir: Path, allow_private: bool) -> ServerProcess:
    model = build_demo_model(preset, str(ROOT / "models" / preset), if_missing=True)

    def make(tmp: Path) -> ServerProcess:
        cfg = write_config(tmp / "config.json", model, model_name=preset,
                           server={"allowedLocalMediaPaths": [str(media_dir / "allowed")],
                                   "allowPrivateMediaUrls": allow_private, "maxRequestLength": 4})
        return ServerProcess(cfg, tmp / "server.log")
    return shared_server(f"mm-{preset}-{allow_private}", request, make)


@pytest.fixture(scope="module")
def vl_srv(request, media_dir):
    return _mm_server(request, "tiny-vl", media_dir, allow_private=True)


@pytest.fixture(scope="module")
def audio_srv(request, media_dir):
    return _mm_server(request, "tiny-audio", media_dir, allow_private=False)


def _ask(srv: ServerProcess, parts: list, **params):
    return srv.post("/", {"inputs": parts, "parameters": {**GREEDY, **params}})


def _image_part(ref: str) -> dict:
    return {"type": "image_url", "image_url": ref}


def test_image_from_path_data_uri_and_url_matches_the_offline_engine(vl_srv, media_dir, media_url):
    png = (media_dir / "allowed" / "cat.png").read_bytes()
    refs = [str(media_dir / "allowed" / "cat.png"), "data:image/png;base64," + base64.b64encode(png).decode(),
            f"{media_url}/cat.png"]
    texts = []
    for ref in refs:
        r = _ask(vl_srv, [{"type": "text", "text": "What is this?"}, _image_part(ref)], details=True)
        assert r.status_code == 200, r.text
        texts.append(r.json()[0]["generated_text"])
        ids = [t["id"] for t in r.json()[0]["details"]["tokens"]]
    assert texts[0] == texts[1] == texts[2]
    llm = LLM(str(ROOT / "models" / "tiny-vl"), cache_block_size=16, num_kv_blocks=128)
    img = Image.open(io.BytesIO(png)).convert("RGB")
    ref = llm.generate([{"parts": [{"type": "text", "text": "What is this?"}, {"type": "image", "image": img}]}],
                       SamplingParams(max_tokens=12, temperature=0.0), use_tqdm=False)[0]
    assert ref.outputs[0].token_ids == ids and ref.outputs[0].text == texts[0]


def test_video_streams_the_same_text_as_non_stream(vl_srv, media_dir):
    parts = [_image_part(str(media_dir / "allowed" / "cat.png")),
             {"type": "video_url", "video_url": str(media_dir / "allowed" / "clip.mp4")},
             {"type": "text", "text": "Describe."}]
    whole = _ask(vl_srv, parts)
    assert whole.status_code == 200, whole.text
    r = vl_srv.post("/", {"inputs": parts, "parameters": GREEDY, "stream": True}, stream=True)
    frames = list(sse_frames(r))
    assert "".join(f["token"]["text"] for f in frames) == frames[-1]["generated_text"] == whole.json()[0]["generated_text"]


def test_audio_from_a_local_file_matches_the_offline_engine(audio_srv, media_dir):
    import soundfile

    wav = media_dir / "allowed" / "tone.wav"
    r = _ask(audio_srv, [{"type": "audio_url", "audio_url": str(wav)}, {"type": "text", "text": "Transcribe."}],
             details=True)
    assert r.status_code == 200, r.text
    assert r.json()[0]["details"]["generated_tokens"] == 12
    ids = [t["id"] for t in r.json()[0]["details"]["tokens"]]
    samples, rate = soundfile.read(str(wav), dtype="float32")
    llm = LLM(str(ROOT / "models" / "tiny-audio"), cache_block_size=16, num_kv_blocks=128)
    ref = llm.generate([{"parts": [{"type": "audio", "audio": samples, "sampling_rate": rate},
                                   {"type": "text", "text": "Transcribe."}]}],
                       SamplingParams(max_tokens=12, temperature=0.0), use_tqdm=False)[0]
    assert ref.outputs[0].token_ids == ids and ref.outputs[0].text == r.json()[0]["generated_text"]


@pytest.mark.parametrize("part, status, needle", [
    (lambda d: _image_part(str(d / "secret.png")), 403, "inputs[0]"),
    (lambda d: _image_part(str(d / "allowed" / ".." / "secret.png")), 403, "inputs[0]"),
    (lambda d: _image_part(str(d / "allowed" / "%2e%2e" / "secret.png")), 403, "inputs[0]"),
    (lambda d: _image_part(str(d / "allowed" / "link.png")), 403, "inputs[0]"),
    (lambda d: {"type": "video_url", "video_url": str(d / "allowed" / "fake.mp4")}, 415, "PNG"),
    (lambda d: _image_part(str(d / "allowed" / "cut.jpg")), 422, "inputs[0]"),
    (lambda d: {"type": "audio_url", "audio_url": str(d / "allowed" / "tone.wav")}, 422, "audio"),
    (lambda d: {"type": "hologram_url", "hologram_url": "x"}, 422, "hologram_url"),
])
def test_bad_media_is_refused_and_the_server_stays_healthy(vl_srv, media_dir, part, status, needle):
    r = _ask(vl_srv, [part(media_dir), {"type": "text", "text": "hi"}])
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]
    assert vl_srv.get("/health").status_code == 200


def test_more_than_twenty_media_items_are_refused(vl_srv, media_dir):
    parts = [_image_part(str(media_dir / "allowed" / "cat.png"))] * 21
    r = _ask(vl_srv, parts)
    assert r.status_code == 422 and "20" in r.json()["error"]


@pytest.mark.parametrize("host", ["127.0.0.1", "169.254.169.254", "10.0.0.1"])
def test_private_addresses_are_refused_without_the_allow_key(audio_srv, host):
    r = _ask(audio_srv, [{"type": "audio_url", "audio_url": f"http://{host}:9/tone.wav"}])
    assert r.status_code == 403, r.text
    assert audio_srv.get("/health").status_code == 200


def test_text_only_model_names_the_modality_it_refuses(request, tiny_model, media_dir):
    srv = plain_server(request, tiny_model)
    r = _ask(srv, [{"type": "text", "text": "hi"}, _image_part(str(media_dir / "allowed" / "cat.png"))])
    assert r.status_code == 422 and "image" in r.json()["error"]
    ok = _ask(srv, [{"type": "text", "text": "River mountain"}])  # text parts alone are plain text
    assert ok.status_code == 200


@pytest.mark.parametrize("path, status, needle", [("/redirect", 422, "redirect"), ("/huge.png", 413, "inputs[0]")])
def test_redirects_and_oversized_bodies_are_refused(vl_srv, media_url, path, status, needle):
    r = _ask(vl_srv, [_image_part(media_url + path), {"type": "text", "text": "hi"}])
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]
    assert vl_srv.get("/health").status_code == 200
