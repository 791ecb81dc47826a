"""The serving core without HTTP (mindie_service.serving): one Frontend over the StandardMock admits, prepares,
fans out best_of samples, folds their events, claims /api/* keys and reports to its observer."""
from __future__ import annotations

import asyncio
import time

import pytest

from mindie_service.devkit.mock_engine import MockEngine
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.errors import ConflictError, OverloadedError, TimeoutError_
from mindie_service.inputs import TextPrompt
from mindie_service.sampling_params import SamplingParams
from mindie_service.serving import Frontend, Submission, Timeouts
from mindie_service.serving.observer import TRACE_HEADERS, SequenceRecord
from multimodal import MediaPolicy


class Tally:
    def __init__(self) -> None:
        self.received = 0
        self.ended: list[bool] = []
        self.sequences: list[int] = []
        self.records: list[SequenceRecord] = []

    def observe_received(self, n: int = 1) -> None:
        self.received += n

    def observe_request(self, *, ok: bool, e2e: float | None) -> None:
        self.ended.append(ok)

    def observe_sequence(self, *, prompt_tokens: int, generated: int, ttft: float | None, e2e: float) -> None:
        self.sequences.append(generated)

    def observe_record(self, rec: SequenceRecord) -> None:
        self.records.append(rec)


def frontend(max_running: int = 2, token: float = 30.0) -> tuple[Frontend, MockEngine, Tally]:
    engine = MockEngine(EngineConfig(model="mock", max_seq_len=256, max_input_token_len=128, max_iter_times=64,
                                     max_prefill_tokens=256))
    engine.start()
    seen = Tally()
    return Frontend(Timeouts(token=token, e2e=60.0), max_running, 2, MediaPolicy(), observer=seen), engine, seen


def submission(engine: MockEngine, prompts: list[str], **kw) -> Submission:
    params = kw.pop("params", SamplingParams(max_tokens=5, temperature=0.9, seed=7))
    return Submission([TextPrompt(p) for p in prompts], params, lambda: engine,
                      [f"r{k}" for k in range(len(prompts))], **kw)


def test_best_of_fans_out_with_moved_seeds_and_folds_each_sample():
    fe, engine, seen = frontend()

    async def main():
        async with fe.open(submission(engine, ["hello"], best_of=3), time.monotonic()) as run:
            return run, await run.results()
    run, results = asyncio.run(main())
    assert [s.request_id for s in run.samples] == ["r0.0", "r0.1", "r0.2"]
    assert [s.params.seed for s in run.samples] == [7, 8, 9]
    assert [len(r.tokens) for r in results] == [5, 5, 5] and all(r.finish_reason == "length" for r in results)
    assert results[0].text != results[1].text  # the samples differ
    assert seen.sequences == [5, 5, 5] and fe.admission.running == 0


def test_merged_events_carry_their_sample_index():
    fe, engine, _ = frontend()

    async def main():
        async with fe.open(submission(engine, ["a", "b"]), time.monotonic()) as run:
            return [k async for k, _ in run.events()]
    ks = asyncio.run(main())
    assert sorted(ks) == [0] * 5 + [1] * 5


def test_a_busy_session_key_is_a_409_and_is_free_again_after():
    fe, engine, _ = frontend()

    async def main():
        async with fe.open(submission(engine, ["a"], session_ids=["key"]), time.monotonic()):
            with pytest.raises(ConflictError, match="already being generated"):
                async with fe.open(submission(engine, ["b"], session_ids=["key"]), time.monotonic()):
                    pass
        async with fe.open(submission(engine, ["c"], session_ids=["key"]), time.monotonic()) as run:
            return await run.results()
    assert len(asyncio.run(main())) == 1


def test_admission_refuses_a_call_wider_than_every_slot():
    fe, engine, _ = frontend(max_running=1)

    async def main():
        async with fe.open(submission(engine, ["a", "b"], slots=2), time.monotonic()):
            pass
    with pytest.raises(OverloadedError):
        asyncio.run(main())


def test_token_timeout_ends_a_stalled_sample():
    fe, engine, _ = frontend(token=0.05)
    engine.token_delay_s = 3600.0  # a stalled engine: only the token timeout can end the sample

    async def main():
        async with fe.open(submission(engine, ["a"]), time.monotonic()) as run:
            await run.results()
    with pytest.raises(TimeoutError_, match="tokenTimeout"):
        asyncio.run(main())


def test_the_tally_counts_each_prompt_once():
    fe, _, seen = frontend()
    with fe.tally() as t:
        t.count(3)
        t.ok = True
    assert seen.received == 3 and seen.ended == [True, True, True]


def test_a_requests_own_timeout_ends_it_naming_its_field():
    fe, engine, _ = frontend()  # tokenTimeout 30 s, e2eTimeout 60 s: only the request's own deadline can fire
    engine.token_delay_s = 3600.0

    async def main():
        async with fe.open(submission(engine, ["a"], timeout=0.05), time.monotonic()) as run:
            await run.results()
    with pytest.raises(TimeoutError_, match=r"parameters\.timeout = 0\.05 s"):
        asyncio.run(main())


def test_a_requests_own_timeout_bounds_its_wait_for_admission():
    fe, engine, _ = frontend(max_running=1)
    engine.token_delay_s = 3600.0

    async def main():
        async with fe.admitted(1, time.monotonic()):  # the only slot, held
            async with fe.open(submission(engine, ["b"], timeout=0.05), time.monotonic()):
                pass
    with pytest.raises(TimeoutError_, match=r"admission queue.*parameters\.timeout"):
        asyncio.run(main())


def test_a_timeout_later_than_e2e_leaves_e2e_in_force():
    assert Timeouts(token=5.0, e2e=60.0).capped(600.0, "parameters.timeout") == Timeouts(token=5.0, e2e=60.0)
    assert Timeouts(token=5.0, e2e=60.0).capped(2.0, "x") == Timeouts(token=2.0, e2e=2.0, e2e_name="x")


def test_a_calls_rank_reaches_every_engine_request():
    fe, engine, _ = frontend()
    seen = []
    real = engine.generate

    def spy(ereq):
        seen.append(ereq)
        return real(ereq)
    engine.generate = spy

    async def main():
        async with fe.open(submission(engine, ["a", "b"], rank=-3), time.monotonic()) as run:
            await run.results()
    asyncio.run(main())
    assert [e.rank for e in seen] == [-3, -3]


def test_each_sequence_is_recorded_with_vllms_finish_reason_and_the_callers_trace_context():
    fe, engine, seen = frontend(token=0.5)
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}

    async def main():
        TRACE_HEADERS.set(headers)  # as a handler does while tracing is on
        async with fe.open(submission(engine, ["a"], best_of=2), time.monotonic()) as run:
            await run.results()
    asyncio.run(main())
    assert [(r.finish_reason, r.generated, len(r.gaps), r.n) for r in seen.records] == [("length", 5, 4, 2)] * 2
    r = seen.records[0]
    assert r.trace_headers == headers and r.t0 <= r.first <= r.last <= r.end and r.max_tokens == 5


def test_a_sequence_cut_short_is_recorded_as_aborted():
    fe, engine, seen = frontend(token=0.05)
    engine.token_delay_s = 3600.0

    async def main():
        async with fe.open(submission(engine, ["a"]), time.monotonic()) as run:
            await run.results()
    with pytest.raises(TimeoutError_):
        asyncio.run(main())
    assert [(r.finish_reason, r.generated, r.first, r.trace_headers) for r in seen.records] == [
        ("abort", 0, None, None)]
