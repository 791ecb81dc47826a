"""Request priority end to end up to the engine: each dialect's field mapped onto one rank (params.priority's
table), the admission queue ordered by rank then arrival with aged waiters first (no starvation), and MindIE's
POST / refusing a parameter it does not know by name (every documented key still taken)."""
from __future__ import annotations

import asyncio

import pytest

from mindie_service.errors import ValidationError
from mindie_service.protocol.mindie import parse_mindie_request
from mindie_service.protocol.mindie_infer import parse_infer_request
from mindie_service.protocol.oip import parse_infer
from mindie_service.protocol.openai import parse_openai
from mindie_service.protocol.request import ProtocolLimits
from mindie_service.protocol.responses_request import parse_responses
from mindie_service.protocol.triton_generate import parse_generate_request
from mindie_service.serving.admission_queue import AdmissionQueue

LIM = ProtocolLimits(vocab_size=100)


def _openai(v):
    return parse_openai({"model": "m", "prompt": "x", "priority": v}, "completion", limits=LIM, model="m").rank


def _responses(v):
    return parse_responses({"model": "m", "input": "x", "priority": v}, [], limits=LIM, model="m").chat.rank


def _root(v):
    return parse_mindie_request({"inputs": "x", "parameters": {"priority": v}}, LIM).rank


def _infer(v):
    return parse_infer_request({"inputs": "x", "parameters": {"priority": v}}, LIM).gen.rank


def _triton(v):
    return parse_generate_request({"text_input": "x", "parameters": {"priority": v}}, LIM, stream=False).rank


def _oip(v):
    body = {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["x"]}],
            "parameters": {"priority": v}}
    return parse_infer(body, LIM).gens[0].rank


@pytest.mark.parametrize("parse, values, ranks", [
    (_openai, [-10, -1, 0, 3, None], [-10, -1, 0, 3, 0]),  # vLLM: lower first, 0 default
    (_responses, [-10, 0, 3, None], [-10, 0, 3, 0]),  # vLLM's field on /v1/responses too
    (_root, [1, 2, 5, None], [-4, -3, 0, 0]),  # MindIE: [1, 5], 1 most urgent, 5 default
    (_infer, [1, 4, None], [-4, -1, 0]),
    (_triton, [0, 1, 5, None], [0, -4, 0, 0]),  # Triton: 0 is the default level
    (_oip, [0, 2, None], [0, -3, 0])])
def test_each_dialect_maps_its_direction_onto_one_rank(parse, values, ranks):
    assert [parse(v) for v in values] == ranks


@pytest.mark.parametrize("parse, bad", [(_root, 0), (_root, 6), (_infer, 0), (_triton, 6), (_triton, -1),
                                        (_oip, 7), (_openai, "1"), (_openai, True), (_responses, 1.5),
                                        (_responses, 2 ** 31)])
def test_out_of_scale_is_refused_naming_priority(parse, bad):
    with pytest.raises(ValidationError, match="priority"):
        parse(bad)


def test_tgi_has_no_priority_and_a_mindie_route_runs_at_the_default_rank():
    from mindie_service.protocol.tgi import parse_tgi_request

    assert parse_tgi_request({"inputs": "x"}, LIM, stream=False).rank == 0


# MindIE.md's POST / parameters, and ours beside them (frequency_penalty, best_of, top_n_tokens, thinking_budget,
# grammar, priority)
DOCUMENTED = {"decoder_input_details": False, "details": True, "do_sample": True, "max_new_tokens": 5,
              "repetition_penalty": 1.03, "return_full_text": False, "seed": 3, "temperature": 0.5, "top_k": 10,
              "top_p": 0.95, "truncate": 8, "typical_p": 0.5, "watermark": False, "stop": ["s"],
              "adapter_id": "None", "frequency_penalty": 0.1, "best_of": 1, "top_n_tokens": 2,
              "thinking_budget": 4, "priority": 3}


def test_root_takes_every_documented_parameter():
    parse_mindie_request({"inputs": "x", "parameters": DOCUMENTED}, LIM)
    parse_infer_request({"inputs": "x", "parameters": {**DOCUMENTED, "timeout": 5}}, LIM)


@pytest.mark.parametrize("route", [parse_mindie_request, parse_infer_request])
def test_root_refuses_an_unknown_parameter_by_name(route):
    with pytest.raises(ValidationError, match="parameters.max_tokens is not supported") as e:
        route({"inputs": "x", "parameters": {"max_tokens": 5}}, LIM)  # OpenAI's name, not MindIE's
    assert e.value.status == 422 and "max_new_tokens" in e.value.message
    with pytest.raises(ValidationError, match="parameters.timeout"):  # /infer's own, not POST /'s
        parse_mindie_request({"inputs": "x", "parameters": {"timeout": 5}}, LIM)


class _Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_admission_queue_serves_by_rank_then_arrival():
    async def main():
        q = AdmissionQueue(1, max_waiting=10, clock=_Clock())
        await q.acquire()
        order: list[str] = []

        async def waiter(name: str, rank: int) -> None:
            await q.acquire(rank=rank)
            order.append(name)

        tasks = []
        for name, rank in (("a0", 0), ("b3", 3), ("c-2", -2), ("d0", 0), ("e-2", -2)):
            tasks.append(asyncio.ensure_future(waiter(name, rank)))
            await _settle()
        for _ in range(6):
            q.release()
            await _settle()
        await asyncio.gather(*tasks)
        assert order == ["c-2", "e-2", "a0", "d0", "b3"]
    asyncio.run(main())


def test_admission_queue_no_waiter_starves_behind_a_flow_of_urgent_ones():
    async def main():
        clock = _Clock()
        q = AdmissionQueue(1, max_waiting=10, aging_s=10.0, clock=clock)
        await q.acquire()
        served: list[str] = []

        async def waiter(name: str, rank: int) -> None:
            await q.acquire(rank=rank)
            served.append(name)

        low = asyncio.ensure_future(waiter("low", 4))
        await _settle()
        for k in range(30):  # an urgent request arrives every second, one slot frees every second
            clock.t += 1.0
            asyncio.ensure_future(waiter(f"hi{k}", -4))
            await _settle()
            q.release()
            await _settle()
            if low.done():
                break
        assert low.done() and served.index("low") == 9  # served at the step its wait reached 10 s
    asyncio.run(main())
