"""MindIE's schedule keys with their effect or refused: maxQueueDelayMicroseconds holds a new prefill batch
(fake clock), supportSelectBatch / prefillTimeMsPerReq / decodeTimeMsPerReq are refused at start-up with
the reason, and the shipped config keeps preemption on (maxPreemptCount > 0, MindIE's default being 0)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from mindie_service.config import load_config
from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.sched.scheduler import Scheduler
from mindie_service.engine.sequence import Sequence
from mindie_service.errors import ConfigError
from mindie_service.sampling_params import SamplingParams

SHIPPED = Path(__file__).resolve().parents[2] / "conf" / "config.json"


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _sched(clock: _Clock, delay_us: int = 5000, **kw) -> Scheduler:
    cfg = EngineConfig(model="x", cache_block_size=4, max_seq_len=256, max_input_token_len=64,
                       max_prefill_tokens=kw.pop("max_prefill_tokens", 256), max_batch_size=8,
                       max_prefill_batch_size=kw.pop("max_prefill_batch_size", 4),
                       max_queue_delay_microseconds=delay_us, max_preempt_count=8)
    return Scheduler(cfg, BlockManager(64, 4, enable_prefix_caching=False), clock=clock)


def _seq(i: int, n: int = 6) -> Sequence:
    return Sequence(f"r{i}", [i + 10] * n, SamplingParams(max_tokens=8), 8, seed=0)


def test_idle_engine_holds_new_prompts_up_to_the_delay_then_runs_them_together():
    clock = _Clock()
    s = _sched(clock)
    s.add(_seq(0))
    out = s.schedule()
    assert out.empty and out.hold_s == pytest.approx(0.005)
    clock.t += 0.003
    s.add(_seq(1))  # joins during the wait: the delay still counts from the first
    out = s.schedule()
    assert out.empty and out.hold_s == pytest.approx(0.002)
    clock.t += 0.002
    out = s.schedule()
    assert [c.request_id for c in out.prefills] == ["r0", "r1"] and out.hold_s == 0


def test_a_full_prefill_batch_does_not_wait():
    clock = _Clock()
    s = _sched(clock, max_prefill_batch_size=2)
    s.add(_seq(0))
    s.add(_seq(1))
    assert len(s.schedule().prefills) == 2
    s = _sched(clock, max_prefill_tokens=10)  # or a full token budget
    s.add(_seq(0))
    s.add(_seq(1))
    assert s.schedule().prefills


def test_new_prompts_join_a_running_batch_at_once():
    clock = _Clock()
    s = _sched(clock)
    s.add(_seq(0))
    clock.t += 1
    out = s.schedule()
    s.update(out, {"r0": 1}, {})
    s.add(_seq(1))
    out = s.schedule()  # r0 decodes: continuous batching, no wait
    assert [c.request_id for c in out.decodes] == ["r0"] and [c.request_id for c in out.prefills] == ["r1"]


def test_zero_delay_never_holds():
    clock = _Clock()
    s = _sched(clock, delay_us=0)
    s.add(_seq(0))
    assert s.schedule().prefills


def _load(tmp_path: Path, doc: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return load_config(path)


def test_shipped_config_preempts_and_mindie_default_is_zero(tmp_path: Path):
    doc = json.loads(SHIPPED.read_text())
    cfg = _load(tmp_path, doc)
    assert 0 < cfg.schedule.max_preempt_count <= cfg.schedule.max_batch_size
    e = cfg.engine_config()
    assert e.max_preempt_count == cfg.schedule.max_preempt_count and e.swap_space_gb == 5.0
    del doc["BackendConfig"]["ScheduleConfig"]["maxPreemptCount"]
    assert _load(tmp_path, doc).schedule.max_preempt_count == 0


@pytest.mark.parametrize("key, value, words", [
    ("supportSelectBatch", True, "supportSelectBatch must be false (this engine has no separate prefill and decode"),
    ("prefillTimeMsPerReq", 100, "prefillTimeMsPerReq must be 150, MindIE's default (it only tunes supportSelectBatch"),
    ("decodeTimeMsPerReq", 20, "decodeTimeMsPerReq must be 50, MindIE's default"),
])
def test_select_batch_keys_are_refused_with_the_reason(tmp_path: Path, key, value, words):
    doc = copy.deepcopy(json.loads(SHIPPED.read_text()))
    doc["BackendConfig"]["ScheduleConfig"][key] = value
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, doc)
    assert words in str(e.value) and f"got {json.dumps(value)}" in str(e.value)
