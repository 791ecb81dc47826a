"""The README's Python snippets run as written (issue 43): the `openai` one needs no `httpx` import (openai 3.x
brings `httpx2`, not `httpx`), and the offline one names the model `make serve` places. The live answer
("Paris") is tests/real/test_real_first_hour.py's; here the snippet runs until it reaches the network."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mindie_service.devkit.certs import generate_dev_certs
from mindie_service.models.packaged_models import PACKAGED_MODELS
from tests.server_utils import ROOT, free_port

README = (ROOT / "README.md").read_text()


def _python_block(section: str) -> str:
    return README.split(section, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_openai_snippet_runs_without_httpx(tmp_path: Path) -> None:
    """Run where `import httpx` fails, as in a fresh `pip install openai` of 3.x: the snippet gets as far as
    connecting (to a closed port), which only an import-clean snippet does."""
    pytest.importorskip("openai")
    generate_dev_certs(str(tmp_path / "security"))
    snippet = _python_block("## Your first hour").replace("127.0.0.1:1025", f"127.0.0.1:{free_port()}")
    no_httpx = "import sys\nsys.modules['httpx'] = None  # ImportError on import, as when it is not installed\n"
    code = no_httpx + snippet.replace("OpenAI(base_url", "OpenAI(max_retries=0, base_url")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "APIConnectionError" in r.stderr and "ModuleNotFoundError" not in r.stderr, r.stderr[-2000:]


def test_the_offline_snippet_names_the_model_make_serve_places() -> None:
    block = _python_block("## Offline API")
    shipped = json.loads((ROOT / "conf" / "config.json").read_text())
    folder = Path(shipped["BackendConfig"]["ModelDeployConfig"]["ModelConfig"][0]["modelWeightPath"]).name
    assert folder in PACKAGED_MODELS and f'LLM(model="models/{folder}"' in block


def test_every_readme_block_says_its_language_and_every_skip_names_a_block() -> None:
    """The snippet test (tests/real/test_real_readme_snippets.py) finds its snippets by their fence's language:
    a block without one would hide a command from it. Each skip names a block that is there, and one block starts
    the server."""
    from tests.readme_blocks import SKIPPED, START, blocks, runnable

    bs = blocks()
    assert [b.line for b in bs if not b.lang] == []
    for prefix in SKIPPED:
        assert any(b.first.startswith(prefix) for b in bs), f"SKIPPED names no README block: {prefix!r}"
    assert len([b for b in bs if START in b.code]) == 1
    order = runnable(bs)
    assert [b.stops_server for b in order if b.talks_to_server] == sorted(b.stops_server for b in order
                                                                          if b.talks_to_server)
    assert any(b.lang == "python" and b.talks_to_server and not b.skip_reason for b in order)
    assert any(b.stops_server and not b.skip_reason for b in order)


def test_the_anthropic_snippet_runs_until_the_network(tmp_path: Path) -> None:
    pytest.importorskip("anthropic")
    generate_dev_certs(str(tmp_path / "security"))
    snippet = _python_block("### Anthropic Messages API").replace("127.0.0.1:1025", f"127.0.0.1:{free_port()}")
    code = snippet.replace("Anthropic(base_url", "Anthropic(max_retries=0, base_url")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "APIConnectionError" in r.stderr, r.stderr[-2000:]
