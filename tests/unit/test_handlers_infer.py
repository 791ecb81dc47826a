"""POST /infer's handler hands its request's timeout and priority (as the scheduler's rank) to the serving core
with the call (server/handlers_infer.py), without a server: the handler's parse and submission alone."""
from __future__ import annotations

from types import SimpleNamespace

from mindie_service.protocol.request import ProtocolLimits
from mindie_service.server.handlers_infer import InferHandler


def test_the_submission_carries_timeout_and_rank():
    h = InferHandler.__new__(InferHandler)  # no Tornado request: parse and submission read only ctx and ids
    h.ctx = SimpleNamespace(limits=ProtocolLimits(vocab_size=100))
    h.engine_id = "e-1"
    req = h.parse({"inputs": "hi", "parameters": {"priority": 2, "timeout": 9, "max_new_tokens": 3}})
    sub = h.submission(req)
    assert (sub.timeout, sub.rank, list(sub.request_ids)) == (9.0, -3, ["e-1"])
    assert sub.params.max_tokens == 3
