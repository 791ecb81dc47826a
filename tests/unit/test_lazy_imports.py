"""Import weight: validating a request never loads the media decoders or the HTTP client, and the
devkit's light parts never load torch. Each check runs in a fresh interpreter."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("av", "PIL", "soundfile", "tornado.httpclient", "torch")


def _loaded_after(code: str) -> dict[str, bool]:
    probe = f"import json, sys\n{code}\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("code", [
    "import multimodal.policy",
    "import multimodal",
    "from multimodal import MediaItem, MediaPolicy, TextPart, parse_parts, sniff",
    "import mindie_service.protocol.request",
])
def test_the_protocol_side_of_multimodal_imports_no_decoder(code: str) -> None:
    loaded = _loaded_after(code)
    assert not any(loaded[m] for m in ("av", "PIL", "soundfile", "tornado.httpclient")), loaded


def test_heavy_names_load_on_first_use_and_are_the_submodules_objects() -> None:
    import importlib

    import multimodal
    from multimodal import decode, parts
    from multimodal import media_loader as loader

    sniff_module = importlib.import_module("multimodal.sniff")

    assert multimodal.load_media is loader.load_media and multimodal.decode_image is decode.decode_image
    assert multimodal.MediaItem is loader.MediaItem is parts.MediaItem  # one class: isinstance checks agree
    assert multimodal.sniff is sniff_module.sniff  # the function, not the submodule of the same name
    assert set(multimodal.__all__) <= set(dir(multimodal))
    with pytest.raises(AttributeError):
        multimodal.no_such_name  # noqa: B018


def test_dev_certificates_do_not_import_torch() -> None:
    assert not _loaded_after("import mindie_service.devkit.certs")["torch"]
