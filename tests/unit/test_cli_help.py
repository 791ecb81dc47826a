"""Every CLI option says what it does, and `demo-model --preset` lists the presets (and takes only those)."""
from __future__ import annotations

import argparse

import pytest

from mindie_service.cli import DEMO_PRESETS, _parser, main
from mindie_service.devkit.presets import PRESETS


def _parsers(p: argparse.ArgumentParser, name: str = "mindie-service"):
    yield name, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub_name, sub in a.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_option_and_command_has_a_help_text():
    missing = []
    for name, p in _parsers(_parser()):
        for a in p._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            if isinstance(a, argparse._SubParsersAction):
                missing += [f"{name} {c.dest}" for c in a._choices_actions if not c.help]
            elif not a.help:
                missing.append(f"{name} {'/'.join(a.option_strings) or a.dest}")
    assert not missing, missing


def test_preset_lists_the_presets(capsys, tmp_path):
    assert sorted(DEMO_PRESETS) == sorted(PRESETS)
    with pytest.raises(SystemExit):
        _parser().parse_args(["demo-model", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert all(name in out for name in PRESETS)
    assert main(["demo-model", "--preset", "huge", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown demo preset 'huge'" in err and all(name in err for name in PRESETS)


def test_an_unknown_log_level_is_a_usage_error_naming_the_choices(capsys):
    """`--log-level LOUD` exits 2 with argparse's usage line, not a traceback; any case of a level works."""
    with pytest.raises(SystemExit) as exc:
        main(["--log-level", "LOUD", "gen-certs", "--help"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "usage: mindie-service" in err and "Traceback" not in err
    assert "invalid choice: 'LOUD'" in err and all(lv in err for lv in ("DEBUG", "INFO", "WARNING", "ERROR"))
    assert _parser().parse_args(["--log-level", "debug", "gen-certs"]).log_level == "DEBUG"
