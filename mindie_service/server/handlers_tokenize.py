"""vLLM's tokenizer routes on the business port: POST /tokenize, POST /detokenize, GET /tokenizer_info
(shapes in protocol/tokenization.py). lm-eval's ``tokenizer_backend=remote`` finds them on its own
(``check_remote_tokenizer_support``) and tokenizes with the served model's tokenizer. Errors in OpenAI's shape.
/tokenize and /detokenize take Ollama's ``keep_alive`` as the generation routes do (params/keep_alive.py)."""
from __future__ import annotations

from typing import Any, AsyncContextManager

from mindie_service.catalog.catalog import Target
from mindie_service.engine.client import EngineClient
from mindie_service.errors import ContextLengthError, MindieError
from mindie_service.params.keep_alive import take_keep_alive
from mindie_service.protocol.openai_encoder import openai_error
from mindie_service.protocol.tokenization import (TokenizeRequest, check_vocab, parse_detokenize, parse_tokenize,
                                                  tokenize_response, tokenizer_info)
from mindie_service.server.handlers_base import BaseHandler
from mindie_service.server.handlers_openai import tool_format


class _TokenizerRoute(BaseHandler):
    def error_json(self, err: MindieError) -> Any:
        status, body = openai_error(err)
        self.set_status(status)
        return body

    def held(self, model: str | None, keep_alive: float | None = None) -> AsyncContextManager[Target]:
        """``model`` (None: the default model) held while the route answers: loaded on demand through the one door
        (ServerContext.hold), ``keep_alive`` (Ollama's, as on every generation route) counting from the answer."""
        if not self.ctx.ready:
            raise self.ctx.loading_error()
        return self.ctx.held(model or self.ctx.model_name, keep_alive)

    @staticmethod
    def hf_tokenizer(engine: EngineClient) -> Any:
        return engine.input_facts.tokenizer  # None: the StandardMock's bytes


class TokenizeHandler(_TokenizerRoute):
    """POST /tokenize (vLLM): {"prompt", "add_special_tokens"} or {"messages"} -> {"tokens", "count", "max_model_len"}."""

    async def post(self) -> None:
        body = self.json_body()
        keep_alive = take_keep_alive(body)
        req = parse_tokenize(body)
        async with self.held(req.model, keep_alive) as target:
            await self._answer(target.engine, req)

    async def _answer(self, engine: EngineClient, req: TokenizeRequest) -> None:
        limit = self.ctx.engine_config.max_seq_len
        bound = self.ctx.frontend.processor(engine).text_bound
        chars = len(req.prompt) if req.prompt is not None else sum(len(str(m.content)) for m in req.messages)
        if bound is not None and chars > bound.refuse_over(limit):
            raise ContextLengthError(f"Parameter prompt must be at most {limit} tokens (maxSeqLen), got a text of "
                                  f"{chars} characters (more than {bound.refuse_over(limit)} characters cannot fit "
                                  f"in {limit} tokens of this tokenizer)")
        ids, strs = await self.ctx.run_blocking(self._tokenize, engine, req)
        self.write_json(tokenize_response(ids, limit, strs))

    def _tokenize(self, engine: EngineClient, req: TokenizeRequest) -> tuple[list[int], list[str] | None]:
        tok = self.hf_tokenizer(engine)
        text = req.prompt if req.prompt is not None else self._render(engine, tok, req)
        if tok is None:
            ids = list(engine.tokenize(text))
            return ids, ([engine.detokenize([i]) for i in ids] if req.return_token_strs else None)
        ids = list(tok(text, add_special_tokens=req.add_special_tokens).input_ids)
        return ids, (list(tok.convert_ids_to_tokens(ids)) if req.return_token_strs else None)

    def _render(self, engine: EngineClient, tok: Any, req: TokenizeRequest) -> str:
        """The prompt the chat route would render for these messages and tools (the same renderer)."""
        return self.ctx.frontend.processor(engine).chat.render(req.messages, req.tools, tool_format(engine, self.ctx),
                                                                 add_generation_prompt=req.add_generation_prompt,
                                                                 template_kwargs=req.template_kwargs)


class DetokenizeHandler(_TokenizerRoute):
    """POST /detokenize (vLLM): {"tokens": [ids]} -> {"prompt": text} (special tokens kept)."""

    async def post(self) -> None:
        body = self.json_body()
        keep_alive = take_keep_alive(body)
        model, ids = parse_detokenize(body)
        async with self.held(model, keep_alive) as target:
            check_vocab(ids, target.engine.vocab_size)
            text = await self.ctx.run_blocking(target.engine.detokenize, ids)
        self.write_json({"prompt": text})


class TokenizerInfoHandler(_TokenizerRoute):
    """GET /tokenizer_info (vLLM): the default model's tokenizer configuration (special tokens, chat template)."""

    async def get(self) -> None:
        async with self.held(self.get_query_argument("model", None)) as target:
            engine = target.engine
            self.write_json(tokenizer_info(self.hf_tokenizer(engine), self.ctx.engine_config.max_seq_len,
                                           engine.vocab_size))
