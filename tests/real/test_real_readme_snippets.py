"""The README runs as written (issue 43): every shell and Python block of README.md, pasted as it is, against a
server started by the README's own by-hand block (`gen-certs --out security`, then `serve --config
conf/config.json --prepare`, the command `make serve` runs) in a fresh folder laid out as a checkout: the shipped
conf/config.json (its three ports moved to free ones, and the snippets' port numbers with them) and `.venv` (this
interpreter's). The server places the packaged SmolLM2 model and serves mutual TLS, as shipped.

Which blocks run, in which order, and which are skipped and why: tests/readme_blocks.py. A block that calls
POST /stopService must stop the server with exit code 0."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.readme_blocks import START, Block, blocks, runnable
from tests.server_utils import ROOT, free_port

pytestmark = pytest.mark.slow

BLOCKS = blocks()


class Checkout:
    """The fresh folder, the server the start block runs there, and the ports it listens on."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ports = (free_port(), free_port(), free_port())
        doc = json.loads((ROOT / "conf" / "config.json").read_text())
        s = doc["ServerConfig"]
        s["port"], s["managementPort"], s["metricsPort"] = self.ports
        (folder / "conf").mkdir()
        (folder / "conf" / "config.json").write_text(json.dumps(doc, indent=2))
        (folder / ".venv").symlink_to(sys.prefix, target_is_directory=True)
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
                        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.log = folder / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self, start_block: Block) -> None:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(["bash", "-e", "-c", start_block.script(self.ports)], cwd=self.folder,
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 600.0) -> None:
        sec = self.folder / "security"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the README's start block exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                r = requests.get(f"https://localhost:{self.ports[1]}/health", verify=str(sec / "ca/ca.pem"),
                                 cert=(str(sec / "certs/client.pem"), str(sec / "keys/client.key.pem")), timeout=5)
                if r.status_code == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        pytest.fail(f"not ready after {timeout} s:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, smollm_gguf) -> Iterator[Checkout]:
    (start,) = [b for b in BLOCKS if START in b.code]
    co = Checkout(tmp_path_factory.mktemp("readme"))
    co.start(start)
    try:
        co.wait_ready()
        yield co
    finally:
        co.stop()


def run(co: Checkout, block: Block) -> subprocess.CompletedProcess:
    code = block.script(co.ports)
    cmd = ["bash", "-e", "-o", "pipefail", "-c", code] if block.lang != "python" else [sys.executable, "-c", code]
    return subprocess.run(cmd, cwd=co.folder, env=co.env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("block", runnable(BLOCKS), ids=lambda b: f"README.md:{b.line}")
def test_the_readme_snippet_runs_as_written(checkout, block):
    if block.skip_reason:
        pytest.skip(block.skip_reason)
    if block.lang != "python" and "curl " in block.code and shutil.which("curl") is None:
        pytest.skip("curl is not installed (the README's shell snippets call it)")
    if block.talks_to_server and checkout.proc.poll() is not None:
        pytest.fail(f"the server is gone before this snippet ran:\n{checkout.log_text()}")
    r = run(checkout, block)
    assert r.returncode == 0, f"{block.code}\nstdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-3000:]}"
    assert '"error"' not in r.stdout, r.stdout[-3000:]  # curl prints an error answer and exits 0
    if block.stops_server:
        assert checkout.proc.wait(120) == 0, checkout.log_text()
