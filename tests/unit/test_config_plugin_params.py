"""ModelConfig[i].plugin_params (MindIE's speculative decoding plugin) in config.json: parsed once per load (the
cross-key check words its error, the loader keeps its value), its problems named by key path."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mindie_service.config import load_config
from mindie_service.engine.configs.spec_config import SpeculativeConfig
from mindie_service.errors import ConfigError

D = "BackendConfig.ModelDeployConfig"
NGRAM = json.dumps({"plugin_type": "memory_decoding", "decoding_length": 4})
DRAFT = json.dumps({"plugin_type": "draft_model", "decoding_length": 3, "draft_model_path": "../draft"})


def _config(tmp_path: Path, plugins: list[str], **deploy: Any) -> Path:
    models = [{"modelName": f"m{i}", "modelWeightPath": f"../models/m{i}", "plugin_params": p}
              for i, p in enumerate(plugins)]
    path = tmp_path / "conf" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"BackendConfig": {"ModelDeployConfig": {"ModelConfig": models, **deploy}}}))
    return path


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The key of every SpeculativeConfig.from_plugin_params call from now on."""
    calls: list[str] = []
    real = SpeculativeConfig.from_plugin_params.__func__  # type: ignore[attr-defined]

    def counting(cls: type[SpeculativeConfig], raw: str, gamma: int | None,
                 key: str = "plugin_params") -> SpeculativeConfig | None:
        calls.append(key)
        return real(cls, raw, gamma, key)

    monkeypatch.setattr(SpeculativeConfig, "from_plugin_params", classmethod(counting))
    return calls


def test_each_plugin_params_is_parsed_once_per_load_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_parses(monkeypatch)
    cfg = load_config(_config(tmp_path, [NGRAM, DRAFT, ""], speculationGamma=4), env={})
    assert calls == [f"{D}.ModelConfig[{i}].plugin_params" for i in range(3)]
    ngram, draft, none = (m.speculative for m in cfg.models)
    assert ngram is not None and (ngram.method, ngram.num_speculative_tokens) == ("ngram", 4)
    assert draft is not None and draft.model == str(tmp_path / "draft")  # resolved against the config's folder
    assert none is None


def test_a_bad_plugin_params_is_parsed_once_and_named_by_its_key(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_parses(monkeypatch)
    path = _config(tmp_path, ['{"plugin_type": "la", "level": 4}', NGRAM], speculationGamma=2)
    with pytest.raises(ConfigError) as exc:
        load_config(path, env={})
    assert len(calls) == 2
    assert exc.value.problems == [
        f"{path}: {D}.ModelConfig[0].plugin_params.plugin_type must be memory_decoding or draft_model (lookahead, "
        "'la', is not supported), got 'la'",
        f"{path}: {D}.speculationGamma must be >= {D}.ModelConfig[1].plugin_params.decoding_length (4), got 2"]
