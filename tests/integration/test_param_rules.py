"""One rule per request parameter, seen from every front door: the output cap, an out-of-range value and the
adapter check give the same decision and the same message text through MindIE's `/`, TGI's `/generate`,
OpenAI's completions and chat, the seed REST API's `/api/generate-one` and a batch job, each message naming
the field as that dialect spells it (one in-process server on the StandardMock engine)."""
from __future__ import annotations

import base64
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from mindie_service.params.output_cap import output_cap
from tests.inprocess import InProcessServer

MAX_ITER_TIMES, MAX_SEQ_LEN = 64, 256  # tests.server_utils.write_mock_config's ScheduleConfig / maxSeqLen
PROMPT = "hello"
LINE = json.dumps([{"role": "user", "text": PROMPT}]).encode()


def _job(options: dict[str, Any], model: str = "mock") -> dict[str, Any]:
    return {"model": model, "prompt_file_path": {"value": base64.b64encode(LINE).decode(), "type": "raw_bytes"},
            "options": options}


# Each dialect: (route, body with the output length set to N, the field as the dialect spells it, refusal status).
DIALECTS: dict[str, tuple[str, Any, str, int]] = {
    "mindie": ("/", lambda n: {"inputs": PROMPT, "parameters": {"max_new_tokens": n, "details": True}},
               "max_new_tokens", 422),
    "tgi": ("/generate", lambda n: {"inputs": PROMPT, "parameters": {"max_new_tokens": n, "details": True}},
            "max_new_tokens", 422),
    "openai-completions": ("/v1/completions", lambda n: {"model": "mock", "prompt": PROMPT, "max_tokens": n},
                           "max_tokens", 400),
    "openai-chat": ("/v1/chat/completions", lambda n: {"model": "mock", "max_completion_tokens": n,
                                                       "messages": [{"role": "user", "content": PROMPT}]},
                    "max_completion_tokens", 400),
    "rest": ("/api/generate-one", lambda n: {"request_id": f"r{n}", "prompt": PROMPT, "stream_response": False,
                                             "generation_config": {"max_new_tokens": n}},
             "generation_config.max_new_tokens", 422),
    "batch-job": ("/batch_inference/submit_job", lambda n: _job({"max_tokens": n}), "options.max_tokens", 422),
}


def _message(body: Any) -> str:
    """The error text in the dialect's shape (MindIE/TGI/REST/jobs ``{"error": str}``, OpenAI's object)."""
    err = body["error"]
    return err["message"] if isinstance(err, dict) else err


class ParamRules(InProcessServer):
    def get_app(self) -> Any:
        self._jobs_dir = tempfile.TemporaryDirectory()
        self.server = {"batchJobsDir": self._jobs_dir.name}
        app = super().get_app()
        self.ctx.start_jobs()
        return app

    def tearDown(self) -> None:
        super().tearDown()
        self._jobs_dir.cleanup()

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        r = self.fetch(path, method="POST", body=json.dumps(body), headers={"Content-Type": "application/json"})
        text = r.body.decode()
        try:
            return r.code, json.loads(text)
        except ValueError:
            return r.code, text  # /api/generate-one answers the bare text

    def _generated(self, dialect: str, code: int, body: Any) -> int:
        """How many tokens the dialect's answer says were generated."""
        assert code == 200, (dialect, body)
        if dialect in ("mindie", "tgi"):
            return (body[0] if isinstance(body, list) else body)["details"]["generated_tokens"]
        if dialect.startswith("openai"):
            return body["usage"]["completion_tokens"]
        if dialect == "rest":
            return len(body)  # the StandardMock's tokens are one character each
        return self._job_tokens(body)

    def _job_tokens(self, job: dict[str, Any]) -> int:
        deadline = time.monotonic() + 60
        while job["status"] not in ("completed", "failed") and time.monotonic() < deadline:
            job = json.loads(self.fetch(f"/batch_inference/job_status?job_id={job['job_id']}").body)
        assert job["status"] == "completed", job
        records = Path(job["success_file_path"]["value"]).read_text().splitlines()
        return json.loads(records[0])["usage"]["completion_tokens"]

    def test_the_output_cap_is_one_decision(self) -> None:
        asked = 1000  # over maxIterTimes
        prompt_len = 6  # "<s>" + five characters (the StandardMock's tokenizer)
        want = output_cap(asked, prompt_len, max_iter_times=MAX_ITER_TIMES, max_seq_len=MAX_SEQ_LEN)
        assert want == MAX_ITER_TIMES
        got = {d: self._generated(d, *self.post(route, body(asked))) for d, (route, body, _f, _s) in DIALECTS.items()}
        assert got == {d: want for d in DIALECTS}

    def test_an_out_of_range_value_is_one_rule_with_one_wording(self) -> None:
        for value, rule in ((0, "in (0, 2147483647]"), (2**31, "in (0, 2147483647]"), (2.5, "an integer"),
                            (True, "an integer")):
            for dialect, (route, body, field, status) in DIALECTS.items():
                code, answer = self.post(route, body(value))
                assert code == status, (dialect, value, answer)
                if dialect == "openai-completions" and value == 0:  # OpenAI's legacy scoring: 0 with echo only
                    assert _message(answer) == (f"Parameter {field} must be at least 1 (0 only with echo: true on "
                                                f"/v1/completions, which scores the prompt), got 0"), answer
                    continue
                assert _message(answer) == f"Parameter {field} must be {rule}, got {value!r}", (dialect, answer)

    def test_the_adapter_check_is_one_decision(self) -> None:
        # The dialects that take an adapter by its own field (MindIE `/`, TGI): one check, one message.
        for adapter, text in (("ghost", "Parameter adapter_id must name a loaded LoRA adapter or \"None\", "
                                        "got 'ghost'"),
                              ("bad id!", "Parameter adapter_id must be a string matching ^[a-zA-Z0-9_./-]{1,256}$, "
                                          "got 'bad id!'")):
            for route in ("/", "/generate"):
                code, answer = self.post(route, {"inputs": PROMPT, "parameters": {"adapter_id": adapter}})
                assert (code, _message(answer)) == (422, text), (route, answer)
        # The dialects whose ``model`` names the adapter (OpenAI, batch jobs): one lookup, one message.
        want = (404, "The model `ghost` does not exist (GET /v1/models lists them)")
        for route, body in (("/v1/completions", {"model": "ghost", "prompt": PROMPT}),
                            ("/v1/chat/completions", {"model": "ghost",
                                                      "messages": [{"role": "user", "content": PROMPT}]}),
                            ("/batch_inference/submit_job", _job({}, model="ghost"))):
            code, answer = self.post(route, body)
            assert (code, _message(answer)) == want, (route, answer)
        # The seed REST API takes no adapter: generation_config refuses the field by name.
        code, answer = self.post("/api/generate-one", {"request_id": "a", "prompt": PROMPT, "stream_response": False,
                                                       "generation_config": {"adapter_id": "ghost"}})
        assert code == 422 and _message(answer).startswith("Parameter generation_config.adapter_id is not a "
                                                           "generation_config field"), answer
