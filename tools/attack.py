#!/usr/bin/env python3
"""Run the attacks of issue #16 against a live server and print, per attack: the status codes, the peak RSS
of the server over its RSS when ready, and the longest stall of a concurrent one-word request.

    .venv/bin/python tools/attack.py                    # serves this checkout on the tiny-vl demo model
    .venv/bin/python tools/attack.py --repo /tmp/base   # the same attacks on another checkout (before/after)

The server is started here (``python -m mindie_service serve``, cwd = --repo) so that its RSS can be read
from /proc. Sizes follow the issue, scaled down where the old code would take minutes (see --scale).
Goal: no attack moves peak RSS by more than 512 MB, no probe stalls more than 1 s, no 5xx.
Attacks that take a checkout down (the regex adapter freezes the old server, /stopService stops it) run last."""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mindie_service.devkit import synth  # noqa: E402
from mindie_service.devkit.lora import build_demo_lora  # noqa: E402
from mindie_service.devkit.presets import build_demo_model  # noqa: E402
from tests.server_utils import free_port  # noqa: E402

MB = 1 << 20


class Server:
    def __init__(self, repo: Path, model: Path, tmp: Path) -> None:
        self.port, self.mport = free_port(), free_port()
        cfg = {"ServerConfig": {"ipAddress": "127.0.0.1", "managementIpAddress": "127.0.0.1", "port": self.port,
                                "managementPort": self.mport, "metricsPort": free_port(), "httpsEnabled": False,
                                "maxLinkNum": 16},
               "BackendConfig": {"tokenizerProcessNumber": 2, "ModelDeployConfig": {
                   "maxSeqLen": 1024, "maxInputTokenLen": 512, "truncation": False,
                   "ModelConfig": [{"modelName": "m", "modelWeightPath": str(model)}]},
                   "ScheduleConfig": {"numKvBlocks": 256, "maxIterTimes": 64}}}
        self.config = tmp / "config.json"
        self.config.write_text(json.dumps(cfg))
        self.log = open(tmp / "server.log", "wb")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(repo))
        self.proc = subprocess.Popen([sys.executable, "-m", "mindie_service", "serve", "--config", str(self.config)],
                                     cwd=repo, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url, self.murl = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.mport}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if requests.get(self.murl + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited: {(tmp / 'server.log').read_text()[-3000:]}")
            time.sleep(0.3)
        raise SystemExit("server not ready")

    def rss(self) -> int:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Watch:
    """Samples the server's RSS and runs the one-word probe while an attack runs."""

    def __init__(self, server: Server) -> None:
        self.server, self.stop = server, threading.Event()
        self.peak, self.stall = 0, 0.0

    def _rss(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.server.rss())
            time.sleep(0.05)

    def _probe(self) -> None:
        body = {"inputs": "Hi", "parameters": {"max_new_tokens": 1}}
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                requests.post(self.server.url + "/generate", json=body, timeout=120)
            except requests.RequestException:
                pass
            self.stall = max(self.stall, time.monotonic() - t)
            time.sleep(0.05)

    def __enter__(self) -> "Watch":
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._rss, self._probe)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(130)


# -- helpers ------------------------------------------------------------------------------------------
def raw(server: Server, data: bytes, *, port: int | None = None, read: bool = True, timeout: float = 60) -> str:
    """Send bytes on a fresh socket; the status code answered ("closed" when none came)."""
    s = socket.create_connection(("127.0.0.1", port or server.port), timeout=timeout)
    try:
        s.sendall(data)
        if not read:
            return "sent"
        head = s.recv(64)
        return head.split(b" ")[1].decode() if head.startswith(b"HTTP/") else "closed"
    except (ConnectionResetError, BrokenPipeError):
        return "reset"
    except socket.timeout:
        return "no answer"
    finally:
        s.close()


def post(url: str, body: Any = None, data: bytes | None = None, timeout: float = 300, **kw: Any) -> str:
    try:
        if data is not None:
            r = requests.post(url, data=data, headers=kw.pop("headers", {"Content-Type": "application/json"}),
                              timeout=timeout, **kw)
        else:
            r = requests.post(url, json=body, timeout=timeout, **kw)
    except requests.Timeout:
        return "timeout"
    except requests.RequestException as e:
        return type(e).__name__
    try:
        json.loads(r.text)
        strict = ""
    except ValueError:
        strict = "!json"
    if "NaN" in r.text:
        strict = "NaN-in-json"
    return f"{r.status_code}{strict}"


def headers(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def parts(uri: str, kind: str, n: int) -> dict:
    return {"inputs": [{"type": f"{kind}_url", f"{kind}_url": uri} for _ in range(n)]
            + [{"type": "text", "text": "What is this?"}], "parameters": {"max_new_tokens": 1}}


def concurrently(*fns: Callable[[], str]) -> list[str]:
    out: list[str] = [""] * len(fns)

    def run(i: int) -> None:
        out[i] = fns[i]()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


# -- the attacks --------------------------------------------------------------------------------------
def attacks(srv: Server, tmp: Path, scale: float, model: Path) -> list[tuple[str, Callable[[], list[str]]]]:
    u = srv.url

    def abandoned() -> list[str]:
        out = []
        for _ in range(10):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(headers("/", 40 * MB) + b" " * int(30 * MB * scale))
            s.close()
            out.append("closed")
        time.sleep(3)
        try:
            st = requests.get(srv.murl + "/v1/status", timeout=10).json().get("connections")
        except (requests.RequestException, ValueError):
            st = None
        return out + [f"handlers={st['handlers'] - 1 if st else 'n/a'}"]

    def long_prompt() -> list[str]:
        text = "word " * int(2 * MB * scale)  # 10 MB at --scale 1
        return concurrently(*[lambda: post(u + "/", {"inputs": text, "parameters": {"max_new_tokens": 1}})] * 2)

    def wide_png() -> list[str]:
        png = synth.image_bytes(int(200_000 * scale) or 1, 1)
        body = parts(data_uri(png, "image/png"), "image", 4)
        return concurrently(*[lambda: post(u + "/", body)] * 2)

    def big_pngs() -> list[str]:
        png = synth.image_bytes(6000, 6000)
        return [post(u + "/", parts(data_uri(png, "image/png"), "image", 20))]

    def long_video() -> list[str]:
        vid = synth.video_bytes(int(6000 * scale) or 12, 64)
        return [post(u + "/", parts(data_uri(vid, "video/mp4"), "video", 1))]

    def stalled() -> list[str]:
        socks = []
        for _ in range(1000):
            try:
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                s.sendall(headers("/", 100_000) + b"0123456789")
                socks.append(s)
            except OSError:
                break
        try:  # the management listener has connections of its own to answer with
            h = requests.get(srv.murl + "/health", timeout=30).status_code
        except requests.RequestException as e:
            h = type(e).__name__
        try:
            st = requests.get(srv.murl + "/v1/status", timeout=10).json().get("connections")
        except (requests.RequestException, ValueError):
            st = None
        for s in socks:
            s.close()
        time.sleep(3)  # let the server see the closes before the next attack
        return [f"opened={len(socks)}", f"mgmt_health={h}", f"server_open={st['open'] if st else 'n/a'}"]

    def sampling() -> list[str]:
        return [post(u + "/", {"inputs": "Hi", "parameters": {"repetition_penalty": 1e-300, "do_sample": True,
                                                               "max_new_tokens": 4}}),
                post(u + "/generate", {"inputs": "Hi", "parameters": {"temperature": 1e-40, "max_new_tokens": 4}})]

    def low() -> list[str]:
        nested = b"[" * 5000 + b"]" * 5000
        ipv6 = {"inputs": [{"type": "image_url", "image_url": "http://[::1/x.png"}, {"type": "text", "text": "x"}]}
        mp4 = tmp / "fast.mp4"
        import av
        import numpy as np
        with av.open(str(mp4), "w", format="mp4", options={"movflags": "faststart"}) as c:
            s = c.add_stream("mpeg4", rate=12)
            s.width = s.height = 128
            s.pix_fmt = "yuv420p"
            for i in range(48):
                for p in s.encode(av.VideoFrame.from_ndarray(np.random.randint(0, 255, (128, 128, 3), np.uint8),
                                                            format="rgb24")):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        cut = mp4.read_bytes()[:350]
        return [post(u + "/", data=nested), post(u + "/", data=b'{"inputs": "hi \\ud800"}'),
                post(u + "/v1/tokenizer", data=b'{"inputs": "hi \\ud800"}'),
                post(u + "/", parts(data_uri(cut, "video/mp4"), "video", 1)), post(u + "/", ipv6),
                raw(srv, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 66_000)]

    def nan_adapter() -> list[str]:
        folder = build_demo_lora(str(model), str(tmp / "nan"), rank=4, seed=1)
        cfg = json.loads((folder / "adapter_config.json").read_text())
        cfg["lora_alpha"] = 3e38
        (folder / "adapter_config.json").write_text(json.dumps(cfg))
        load = post(srv.murl + "/v1/load_lora_adapter", {"lora_name": "nan", "lora_path": str(folder)})
        gen = post(u + "/", {"inputs": "Hi", "parameters": {"max_new_tokens": 2, "adapter_id": "nan",
                                                              "details": True}})
        return [f"load={load}", f"generate={gen}"]

    def regex_adapter() -> list[str]:
        folder = build_demo_lora(str(model), str(tmp / "re"), rank=4, seed=1)
        cfg = json.loads((folder / "adapter_config.json").read_text())
        cfg["rank_pattern"] = {"(\\w|.)*Z": 4}
        (folder / "adapter_config.json").write_text(json.dumps(cfg))
        return [post(srv.murl + "/v1/load_lora_adapter", {"lora_name": "re", "lora_path": str(folder)},
                     timeout=20)]

    def stop_form() -> list[str]:
        r = post(srv.murl + "/stopService", data=b"x=1",
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
        time.sleep(2)
        return [r, "server alive" if srv.proc.poll() is None else "server STOPPED"]

    return [("1 abandoned uploads x10", abandoned), ("2 two long prompts", long_prompt),
            ("3 wide PNG x4, twice", wide_png), ("3 twenty 36 MP PNGs", big_pngs), ("3 long video", long_video),
            ("4 1000 stalled bodies", stalled), ("5 overflowing sampling", sampling),
            ("low: nesting/surrogates/mp4/ipv6/431", low), ("7 adapter alpha 3e38", nan_adapter),
            ("6 regex adapter", regex_adapter), ("low: stopService form post", stop_form)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default=str(ROOT), help="checkout to serve (default: this one)")
    ap.add_argument("--scale", type=float, default=1.0, help="size factor for the big inputs")
    ap.add_argument("--only", default="", help="comma-separated attack number prefixes to run")
    args = ap.parse_args()
    model = ROOT / "models" / "tiny-vl"
    build_demo_model("tiny-vl", str(model), if_missing=True)
    tmp = Path(tempfile.mkdtemp(prefix="attack-"))
    srv = Server(Path(args.repo), model, tmp)
    try:
        base = srv.rss()
        print(f"server {args.repo}: RSS when ready {base / MB:.0f} MB; machine shared, timings are noisy")
        print(f"{'attack':40s} {'RSS before':>11s} {'peak rise':>10s} {'peak over ready':>16s} {'longest probe':>14s}"
              f"  statuses")
        for name, fn in attacks(srv, tmp, args.scale, model):
            if args.only and not any(name.startswith(p) for p in args.only.split(",")):
                continue
            if srv.proc.poll() is not None:
                print(f"{name:40s} (server gone)")
                continue
            before = srv.rss()
            with Watch(srv) as w:
                statuses = fn()
            print(f"{name:40s} {before / MB:8.0f} MB {(w.peak - before) / MB:7.0f} MB {(w.peak - base) / MB:13.0f} MB "
                  f"{w.stall:12.2f} s  {' '.join(statuses)}", flush=True)
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
