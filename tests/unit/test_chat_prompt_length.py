"""An over-long chat prompt's error names the field the client sent, `messages`, not `inputs` (issue 28)."""
from __future__ import annotations

import json

from tests.inprocess import InProcessServer


class ChatPromptLengthTest(InProcessServer):
    def test_an_over_long_chat_prompt_names_messages(self) -> None:
        # the mock tokenizes a byte a token: 200 bytes pass the pre-render bound and fail maxInputTokenLen (128)
        body = {"model": "mock", "messages": [{"role": "user", "content": "a" * 200}], "max_tokens": 1}
        r = self.fetch("/v1/chat/completions", method="POST", body=json.dumps(body),
                       headers={"Content-Type": "application/json"})
        err = json.loads(r.body)["error"]
        assert r.code == 400 and err["param"] == "messages", err
        assert err["message"].startswith("Parameter messages must be at most"), err
