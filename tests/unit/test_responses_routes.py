"""The Responses routes in process on the StandardMock engine (fast): a key reads only its own responses,
previous_response_id continues the stored conversation, a resumed stream starts right after the event named,
cancel frees the engine's sequence, and the errors are OpenAI's."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from tests.inprocess import InProcessServer

KEY_A, KEY_B = "unit-key-a-0123456789abcdef", "unit-key-b-0123456789abcdef"


class ResponsesRoutes(InProcessServer):
    server = {"businessApiKeys": [KEY_A, KEY_B]}

    def call(self, method: str, path: str, body: Any = None, key: str = KEY_A) -> tuple[int, Any]:
        r = self.fetch(path, method=method, body=None if body is None else json.dumps(body),
                       headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                       allow_nonstandard_methods=True, raise_error=False)
        text = r.body.decode()
        return r.code, json.loads(text) if text.startswith("{") else text

    def create(self, key: str = KEY_A, **body: Any) -> dict[str, Any]:
        code, out = self.call("POST", "/v1/responses", {"model": "mock", "max_output_tokens": 6, **body}, key)
        assert code == 200, out
        return out

    def settle(self, rid: str, want: str, timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code, out = self.call("GET", f"/v1/responses/{rid}")
            if out.get("status") == want:
                return out
            self.io_loop.run_sync(lambda: asyncio.sleep(0.02))
        raise AssertionError(f"{rid} never became {want}: {out}")

    def test_a_key_reads_only_its_own_responses(self):
        r = self.create(input="hello")
        assert self.call("GET", f"/v1/responses/{r['id']}")[0] == 200
        for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/input_items"), ("POST", "/cancel")):
            code, out = self.call(method, f"/v1/responses/{r['id']}{path}", {} if method == "POST" else None, KEY_B)
            assert code == 404 and out["error"]["type"] == "invalid_request_error", (method, path, out)
        code, _ = self.call("POST", "/v1/responses", {"model": "mock", "input": "x", "previous_response_id": r["id"]},
                            KEY_B)
        assert code == 404

    def test_previous_response_id_continues_the_stored_conversation(self):
        first = self.create(input="hello there", instructions="first only")
        text = first["output"][0]["content"][0]["text"]
        second = self.create(input="and then?", previous_response_id=first["id"])
        code, chat = self.call("POST", "/v1/chat/completions", {"model": "mock", "max_tokens": 6, "messages": [
            {"role": "user", "content": "hello there"}, {"role": "assistant", "content": text},
            {"role": "user", "content": "and then?"}]})
        assert code == 200 and second["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
        assert second["previous_response_id"] == first["id"] and second["instructions"] is None
        code, items = self.call("GET", f"/v1/responses/{second['id']}/input_items?order=asc")
        assert [i["content"][0]["text"] for i in items["data"]] == ["and then?"]

    def test_a_resumed_stream_starts_right_after_the_event_named(self):
        r = self.create(input="go", background=True, stream=False)
        assert r["status"] == "queued"
        code, _ = self.call("GET", f"/v1/responses/{r['id']}?stream=true")
        assert code == 400  # only a background *stream* is recorded as events
        s = self.create(input="go", background=True, stream=True)
        assert isinstance(s, str)  # (the create call's SSE body, read to its end)
        rid = json.loads(s.split("data: ", 2)[1].split("\n")[0])["response"]["id"]
        self.settle(rid, "incomplete")
        code, body = self.call("GET", f"/v1/responses/{rid}?stream=true&starting_after=3")
        seqs = [json.loads(line[6:])["sequence_number"] for line in body.splitlines() if line.startswith("data: ")]
        whole = [json.loads(line[6:])["sequence_number"] for line in s.splitlines() if line.startswith("data: ")]
        assert code == 200 and seqs == whole[4:] and whole == list(range(len(whole)))

    def test_cancel_ends_cancelled_and_frees_the_sequence(self):
        self.engine.token_delay_s = 0.05  # 64 tokens (maxIterTimes) take 3 s
        r = self.create(input="go", background=True, max_output_tokens=5000)
        self.settle(r["id"], "in_progress")
        code, out = self.call("POST", f"/v1/responses/{r['id']}/cancel", {})
        assert code == 200 and out["status"] == "cancelled"
        assert self.engine._active == {}  # the engine's request is gone when the cancel answers
        assert len(self.ctx.responses_service().store.tokens(r["id"])) < 16
        assert self.call("GET", f"/v1/responses/{r['id']}")[1]["status"] == "cancelled"

    def test_unknown_fields_and_routes_answer_in_openais_shape(self):
        code, out = self.call("POST", "/v1/responses", {"model": "mock", "input": "x", "seed": 3})
        assert code == 400 and out["error"]["param"] == "seed"
        code, out = self.call("GET", "/v1/responses/resp_nope")
        assert code == 404 and "error" in out
        code, out = self.call("GET", "/v1/nowhere")
        assert code == 404 and out["error"]["code"] == "not_found"

    def test_a_background_response_cut_by_a_restart_resumes_numbering_and_text(self):
        s = self.create(input="go", background=True, stream=True, max_output_tokens=20)
        rid = json.loads(s.split("data: ", 2)[1].split("\n")[0])["response"]["id"]
        self.settle(rid, "incomplete")
        svc = self.ctx.responses_service()
        # Cut it as a kill -9 after its 8th token would have: created, in_progress, then the first token's
        # item.added, part.added and delta (seq 2-4), one delta for each later token.
        db = svc.store._db
        db.execute("DELETE FROM response_tokens WHERE id = ? AND n >= 8", (rid,))
        db.execute("DELETE FROM response_events WHERE id = ? AND seq > 11", (rid,))
        db.execute("UPDATE responses SET status = 'in_progress', response = json_set(response, '$.status', "
                   "'in_progress') WHERE id = ?", (rid,))
        assert self.io_loop.run_sync(svc.resume_all) == 1
        final = self.settle(rid, "incomplete")
        code, body = self.call("GET", f"/v1/responses/{rid}?stream=true")
        events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
        assert len(deltas) == 20 and final["usage"]["output_tokens"] == 20
        assert [o["type"] for o in final["output"]] == ["message"]
        assert "".join(deltas) == final["output"][0]["content"][0]["text"]

    def test_include_logprobs_gives_one_per_output_token(self):
        r = self.create(input="go", include=["message.output_text.logprobs"], top_logprobs=2)
        part = r["output"][0]["content"][0]
        assert len(part["logprobs"]) == r["usage"]["output_tokens"] == 6
        assert all(isinstance(x["logprob"], float) and len(x["top_logprobs"]) <= 2 for x in part["logprobs"])
        assert "logprobs" not in self.create(input="go")["output"][0]["content"][0]

    def test_a_background_prompt_that_cannot_run_is_the_create_calls_400(self):
        code, out = self.call("POST", "/v1/responses", {"model": "mock", "input": "x" * 400, "background": True})
        assert code == 400 and "at most" in out["error"]["message"], out
        code, out = self.call("POST", "/v1/responses", {"model": "mock", "input": "x", "stream": True,
                                                         "stream_options": {"include_obfuscation": "yes"}})
        assert code == 400 and out["error"]["param"] == "stream_options"

    def test_include_obfuscation_pads_each_delta_event_of_that_transmission_only(self):
        def events(body: str) -> list[dict[str, Any]]:
            return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]

        padded = events(self.create(input="go", stream=True, stream_options={"include_obfuscation": True}))
        deltas = [e for e in padded if e["type"].endswith(".delta")]
        assert deltas and all(isinstance(e["obfuscation"], str) and e["obfuscation"] for e in deltas)
        assert not any("obfuscation" in e for e in padded if not e["type"].endswith(".delta"))
        assert not any("obfuscation" in e for e in events(self.create(input="go", stream=True)))
        s = self.create(input="go", background=True, stream=True, stream_options={"include_obfuscation": True})
        rid = events(s)[0]["response"]["id"]
        self.settle(rid, "incomplete")  # the store keeps events unpadded; each replay pads as it is asked
        plain = events(self.call("GET", f"/v1/responses/{rid}?stream=true")[1])
        assert plain and not any("obfuscation" in e for e in plain)
        again = events(self.call("GET", f"/v1/responses/{rid}?stream=true&include_obfuscation=true")[1])
        assert all("obfuscation" in e for e in again if e["type"].endswith(".delta"))
        code, out = self.call("GET", f"/v1/responses/{rid}?stream=true&include_obfuscation=maybe")
        assert code == 400 and out["error"]["param"] == "include_obfuscation"

    def test_a_cancel_made_through_another_replica_stops_the_generation(self):
        self.engine.token_delay_s = 0.04  # 64 tokens (maxIterTimes) take 2.6 s; the store is read every 32
        r = self.create(input="go", background=True, max_output_tokens=5000)
        self.settle(r["id"], "in_progress")
        store = self.ctx.responses_service().store  # another replica sharing the store writes the cancel
        store.update(r["id"], {**self.call("GET", f"/v1/responses/{r['id']}")[1], "status": "cancelled"})
        deadline = time.monotonic() + 10
        while self.engine._active and time.monotonic() < deadline:
            self.io_loop.run_sync(lambda: asyncio.sleep(0.02))
        assert self.engine._active == {} and store.status(r["id"]) == "cancelled"
        assert len(store.tokens(r["id"])) < 64  # stopped before its end
        assert store.get_any(r["id"]).response["status"] == "cancelled"
