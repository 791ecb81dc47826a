"""Helpers for the HTTP tests: write a config, start the real server process on free loopback ports,
wait until it is ready, read SSE streams, stop it (SIGTERM) at the end of the session.

Server processes are shared across test modules through ``shared_server`` (one per name, for the whole
session); one that died is a test failure, never silently replaced. Ports come from ``free_port``, which
leaves each in TIME_WAIT so the kernel hands it to no one else, and a server that still finds its port
taken is started again on fresh ones (``launch``)."""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# MindIE's sample request body for POST / (single-modal), from the seed document.
SEED_BODY = {
    "inputs": "My name is Olivier and I",
    "parameters": {"decoder_input_details": True, "details": True, "do_sample": True, "max_new_tokens": 20,
                   "repetition_penalty": 1.03, "return_full_text": False, "seed": None, "temperature": 0.5,
                   "top_k": 10, "top_p": 0.95, "truncate": None, "typical_p": 0.5, "watermark": False,
                   "stop": ["stop1", "stop2"], "adapter_id": "None"},
    "stream": False,
}

# Small and fast: the tiny demo model, 16-token KV blocks, a fixed KV pool.
BASE_SCHEDULE = {"cacheBlockSize": 16, "maxPrefillTokens": 512, "maxBatchSize": 32, "maxPrefillBatchSize": 16,
                 "maxIterTimes": 128, "numKvBlocks": 256}


def free_port() -> int:
    """A loopback port nobody else will be given for a while: after one accepted connection is closed from
    the listening side, the port sits in TIME_WAIT (about 60 s), where ``bind(port 0)`` never picks it but a
    server binding it with SO_REUSEADDR (Tornado, http.server) can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        addr = s.getsockname()
        with socket.create_connection(addr) as client:
            conn, _ = s.accept()
            conn.close()  # the accepted side closes first: the TIME_WAIT lands on our port
            client.recv(1)
        return addr[1]


def percentile(xs: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``xs`` (NaN when empty): the latency figures of the tools."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100.0 * (len(xs) - 1))))]


class PortInUse(RuntimeError):
    """The server could not bind one of its ports (another process took it between choice and bind)."""


def write_config(path: Path, model: Path, *, server: dict[str, Any] | None = None,
                 deploy: dict[str, Any] | None = None, schedule: dict[str, Any] | None = None,
                 model_name: str = "tiny") -> Path:
    srv = {"ipAddress": "127.0.0.1", "managementIpAddress": "127.0.0.1", "port": free_port(),
           "managementPort": free_port(), "metricsPort": free_port(), "httpsEnabled": False,
           "maxLinkNum": 64, "maxRequestLength": 1}
    srv.update(server or {})
    dep = {"maxSeqLen": 512, "maxInputTokenLen": 256,
           "ModelConfig": [{"modelName": model_name, "modelWeightPath": str(model)}]}
    dep.update(deploy or {})
    sch = dict(BASE_SCHEDULE)
    sch.update(schedule or {})
    # Preempt when blocks run out, as the shipped config does (MindIE's default 0 reserves whole outputs).
    sch.setdefault("maxPreemptCount", sch["maxBatchSize"])
    cfg = {"LogConfig": {"logLevel": "Info"}, "ServerConfig": srv,
           "BackendConfig": {"tokenizerProcessNumber": 1, "ModelDeployConfig": dep, "ScheduleConfig": sch}}
    path.write_text(json.dumps(cfg, indent=2))
    return path


def write_mock_config(folder: Path, **server: Any) -> Path:
    """``folder``/config.json for an in-process server on the StandardMock engine (no weights): plain HTTP,
    one tokenizer worker, small limits; ``server`` overrides ServerConfig keys."""
    cfg = {"ServerConfig": {"httpsEnabled": False, "maxLinkNum": 8, **server},
           "BackendConfig": {"tokenizerProcessNumber": 1, "ModelDeployConfig": {
               "maxSeqLen": 256, "maxInputTokenLen": 128,
               "ModelConfig": [{"modelInstanceType": "StandardMock", "modelName": "mock", "modelWeightPath": "none"}]},
               "ScheduleConfig": {"maxPrefillTokens": 256, "maxIterTimes": 64}}}
    path = folder / "config.json"
    path.write_text(json.dumps(cfg))
    return path


class ServerProcess:
    """``python -m mindie_service serve --config PATH [ARGS]`` as a child process."""

    def __init__(self, config: Path, log: Path, *, verify: Any = None, cert: Any = None,
                 args: tuple[str, ...] = ()) -> None:
        self.config_path, self.args = config, args
        self.cfg = json.loads(config.read_text())["ServerConfig"]
        self.log_path = log
        self.scheme = "https" if self.cfg.get("httpsEnabled", True) else "http"
        self.verify, self.cert = verify, cert
        self.proc: subprocess.Popen | None = None

    def url(self, plane: str = "business") -> str:
        port = {"business": self.cfg["port"], "management": self.cfg["managementPort"],
                "metrics": self.cfg["metricsPort"]}[plane]
        host = "localhost" if self.scheme == "https" else "127.0.0.1"
        return f"{self.scheme}://{host}:{port}"

    def start(self) -> "ServerProcess":
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "mindie_service", "serve", "--config", str(self.config_path),
                                      *self.args],
                                     cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=die_with_parent)
        return self

    def wait_ready(self, timeout: float = 120.0, loading_timeout: float = 480.0) -> "ServerProcess":
        """Until /health answers 200: ``timeout`` s to answer at all, then up to ``loading_timeout`` s in all while it
        answers 503 (loading, starting). Both bound a stall, not the machine's speed: a loaded machine's server loads
        its model many times slower than a quiet one's, and says so."""
        start = time.monotonic()
        deadline = start + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log()
                kind = PortInUse if "Address already in use" in log else RuntimeError
                raise kind(f"server exited with {self.proc.returncode}:\n{log}")
            try:
                r = requests.get(self.url("management") + "/health", timeout=2, verify=self.verify, cert=self.cert)
                if r.status_code == 200:
                    return self
                deadline = max(deadline, start + loading_timeout)  # it answers: it is loading
            except OSError:  # requests' errors, and TLS files `serve --prepare` has not written yet
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {time.monotonic() - start:.0f} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        try:
            return stop_process(self.proc, timeout)
        finally:
            self._log.close()

    # -- client helpers --------------------------------------------------------------------------
    def post(self, path: str, body: Any, plane: str = "business", **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 60)
        return requests.post(self.url(plane) + path, json=body, verify=self.verify, cert=self.cert, **kw)

    def get(self, path: str, plane: str = "business", **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 30)
        return requests.get(self.url(plane) + path, verify=self.verify, cert=self.cert, **kw)

    def status(self) -> dict[str, Any]:
        return self.get("/v1/status", "management").json()


def sse_frames(resp: requests.Response) -> Iterator[dict[str, Any]]:
    """The JSON payload of each ``data:`` line of an SSE response, as it arrives."""
    for line in resp.iter_lines():
        if line.startswith(b"data:"):
            yield json.loads(line[5:])


def wait_until(cond: Callable[[], bool], timeout: float = 15.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()


def launch(make: Callable[[], ServerProcess], attempts: int = 3) -> ServerProcess:
    """``make()`` (which writes a config with fresh ports), start it and wait until ready; started again with
    a new ``make()`` when a port was taken before the server bound it."""
    for attempt in range(attempts):
        srv = make().start()
        try:
            return srv.wait_ready()
        except PortInUse:
            srv.stop()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


_SERVERS: dict[str, ServerProcess] = {}


def shared_server(name: str, request: pytest.FixtureRequest, make: Callable[[Path], ServerProcess]) -> ServerProcess:
    """One server per ``name`` for the whole session, whichever module or test asks first; stopped when the
    session ends. A shared server that has exited fails the test asking for it, with its log: a crash must
    not be papered over by a fresh process."""
    srv = _SERVERS.get(name)
    if srv is not None:
        if srv.proc is not None and srv.proc.poll() is not None:
            pytest.fail(f"shared server {name!r} died (exit code {srv.proc.returncode}); its log:\n{srv.log()}")
        return srv
    factory = request.getfixturevalue("tmp_path_factory")
    srv = launch(lambda: make(factory.mktemp(name)))
    _SERVERS[name] = srv
    request.config.add_cleanup(srv.stop)  # the session's end, whatever scope the asking fixture has
    return srv


def plain_server(request: pytest.FixtureRequest, tiny_model: Path) -> ServerProcess:
    """HTTP, three listeners, MindIE defaults for `/` (list ids, delta text)."""
    return shared_server("plain", request, lambda tmp: ServerProcess(
        write_config(tmp / "config.json", tiny_model), tmp / "server.log"))


def alt_server(request: pytest.FixtureRequest, tiny_model: Path) -> ServerProcess:
    """One listener for every plane; streamTokenIdFormat "int" (TGI's client streams from `/`),
    fullTextEnabled, maxLinkNum 2, room for long generations (load and disconnect tests)."""
    def make(tmp: Path) -> ServerProcess:
        port = free_port()
        cfg = write_config(tmp / "config.json", tiny_model,
                           server={"port": port, "managementPort": port, "metricsPort": port, "maxLinkNum": 2,
                                   "streamTokenIdFormat": "int", "fullTextEnabled": True},
                           deploy={"maxSeqLen": 4096, "maxInputTokenLen": 256},
                           schedule={"maxIterTimes": 4000, "numKvBlocks": 600, "maxPrefillTokens": 4096})
        return ServerProcess(cfg, tmp / "server.log")
    return shared_server("alt", request, make)


def die_with_parent() -> None:
    """In a test's child process (``preexec_fn``): the kernel kills it when the test's process dies, however it dies
    (a parallel worker killed for memory, a run stopped with Ctrl-C), so that no server outlives its test run."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> int | None:
    """SIGTERM (the server drains), then kill after ``timeout`` s; the exit code, or None when it was killed."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        return None
