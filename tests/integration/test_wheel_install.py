"""End to end through a real install: build the wheel, install it (not editable) into a fresh
venv, and serve the tiny demo model with the installed `mindie-service` from a folder outside
the checkout. Proves the wheel carries everything the service reads at run time (the config
schema above all) and installs nothing but our three packages at the top level."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest
import requests

from tests.server_utils import ROOT, die_with_parent, free_port

TOP_LEVEL = {"mindie_service", "multimodal", "npu_ops"}
# Top-level folders that are no build input (large or machine-local): never copied to the build folder.
_NOT_SOURCES = {".venv", "models", "build", "dist", "security", ".git", ".cache", ".pytest_cache"}

pytestmark = pytest.mark.e2e


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload]
    assert out.returncode == 0, f"{cmd} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH or venv of the caller: the installed copy must be found on its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    return env


def _skip(folder: str, names: list[str]) -> set[str]:
    top = _NOT_SOURCES if Path(folder) == ROOT else set()
    return {n for n in names if n in top or n == "__pycache__" or n.endswith(".egg-info")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy so the shared checkout gets no build/ or egg-info, and no stale build/lib
    # (setuptools never prunes it) can leak removed modules into the wheel.
    tmp = tmp_path_factory.mktemp("wheel")
    src, out = tmp / "src", tmp / "dist"
    shutil.copytree(ROOT, src, ignore=_skip)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
          "--no-build-isolation", "-w", str(out), str(src)])
    (whl,) = out.glob("mindie_service-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv") / "v"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(root)])
    py = str(root / "bin" / "python")
    purelib = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # --system-site-packages from a venv's python reaches the base interpreter, not this venv, so
    # torch and the other dependencies come in by a plain path entry. Plain: the .pth files there
    # (the checkout's editable-install hook among them) are not processed.
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (purelib / "_mindie_test_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--disable-pip-version-check",
          "--no-deps", "--no-index", str(wheel)])
    return root


def test_wheel_installs_only_our_packages_and_carries_the_schema(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == TOP_LEVEL, top
    assert "mindie_service/config/config.schema.json" in names
    assert not any(n.startswith("mindie_service/config.py") for n in names)


def test_installed_wheel_serves_a_generation(venv: Path, tiny_model: Path, tmp_path: Path) -> None:
    py, env = str(venv / "bin" / "python"), _clean_env()
    probe = ("import json, sysconfig, mindie_service, mindie_service.config as c; "
             "print(json.dumps([mindie_service.__file__, c.load_schema()['$schema'], sysconfig.get_paths()['purelib']]))")
    where, schema_id, purelib = json.loads(_run([py, "-c", probe], cwd=tmp_path, env=env).stdout)
    assert Path(where).resolve().is_relative_to(Path(purelib).resolve()), where
    assert not Path(where).resolve().is_relative_to(ROOT)
    assert "json-schema.org" in schema_id

    cfg = json.loads((ROOT / "conf" / "config.json").read_text())
    port, mgmt, metrics = free_port(), free_port(), free_port()
    cfg["ServerConfig"].update(httpsEnabled=False, port=port, managementPort=mgmt, metricsPort=metrics)
    dep = cfg["BackendConfig"]["ModelDeployConfig"]
    dep.update(maxSeqLen=512, maxInputTokenLen=256)
    dep["ModelConfig"][0].update(modelName="tiny", modelWeightPath=str(tiny_model.resolve()))
    cfg["BackendConfig"]["ScheduleConfig"].update(numKvBlocks=64)  # 64 x 16 tokens: no 2 GB pool
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg, indent=2))

    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(venv / "bin" / "mindie-service"), "serve", "--config", str(config)],
                                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_healthy(proc, base + "/health", log_path)
            r = requests.post(base + "/", json={"inputs": "My name is Olivier and I",
                                                "parameters": {"max_new_tokens": 8}}, timeout=60)
            assert r.status_code == 200, r.text
            body = r.json()
            item = body[0] if isinstance(body, list) else body
            assert isinstance(item["generated_text"], str) and item["generated_text"]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, log_path.read_text(errors="replace")[-4000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log_path: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log_path.read_text(errors='replace')[-4000:]}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    pytest.fail(f"not healthy after {timeout} s:\n{log_path.read_text(errors='replace')[-4000:]}")
