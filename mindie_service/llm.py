"""The offline API, in vLLM's shape: ``LLM(model=...).generate(prompts, SamplingParams(...))``.

Progress, as vLLM shows it: where the application has configured no logging (no handler on the root logger nor
on ours), ``LLM`` gives the loggers of this project's packages a handler of their own that prints INFO lines to
stderr (loading, packing the weights, the KV pool, ready), and stops them propagating, so the root logger is never
touched. ``MINDIE_CONFIGURE_LOGGING=0`` leaves logging alone; an application that configures logging itself
(``logging.basicConfig(level=logging.INFO)``) sees the same lines through its own handlers."""
from __future__ import annotations

import itertools
import logging
import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence as Seq

from mindie_service.engine.async_engine import engine_pooling, input_facts
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.core import LLMEngine
from mindie_service.engine.contract import EngineRequest, FailedEvent, PoolRequest, check_task
from mindie_service.engine.pooling.pool_setup import check_pool_request
from mindie_service.errors import GenerationError, check
from mindie_service.inputs import InputProcessor, PartsPrompt, Prompt, TextPrompt, TokensPrompt
from mindie_service.inputs.pool_inputs import pair_inputs, pool_inputs
from mindie_service.protocol.request import GenerationResult
from mindie_service.sampling_params import SamplingParams


logger = logging.getLogger(__name__)

PACKAGES = ("mindie_service", "npu_ops", "multimodal")  # the loggers whose lines show a load's progress
CONFIGURE_ENV = "MINDIE_CONFIGURE_LOGGING"


def show_progress() -> bool:
    """vLLM's default: unless ``MINDIE_CONFIGURE_LOGGING=0`` or logging is configured already, each of
    ``PACKAGES``' loggers prints INFO lines to stderr through a handler of its own (not propagated: the root
    logger is left as it is). True when it set them up."""
    if os.environ.get(CONFIGURE_ENV, "1") == "0" or logging.getLogger().handlers:
        return False
    loggers = [logging.getLogger(name) for name in PACKAGES]
    if any(lg.handlers for lg in loggers):
        return False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for lg in loggers:
        lg.addHandler(handler)
        lg.propagate = False
        if lg.level == logging.NOTSET:
            lg.setLevel(logging.INFO)
    return True


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    cumulative_logprob: float
    logprobs: list[dict[int, float]] | None  # per token: chosen + top-n alternatives, when asked
    reasoning_content: str | None = None  # the thinking, apart from ``text`` (SamplingParams.split_reasoning)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt_logprobs: list[float | None] | None = None
    seed: int | None = None
    finished: bool = True
    # vLLM's RequestMetrics times (time.time()): arrival_time (queued), first_token_time, last_token_time;
    # a benchmark takes decode speed apart from prefill with them
    metrics: dict[str, float] = field(default_factory=dict)


class LLM:
    """Load a checkpoint and generate in batches. Keyword overrides are EngineConfig fields
    (snake_case forms of MindIE's schedule keys: max_batch_size, cache_block_size, max_seq_len,
    max_iter_times, max_prefill_tokens, num_kv_blocks, ...). ``world_size=N`` splits the model over N
    tensor-parallel ranks (N - 1 worker processes are spawned; ``device_ids`` picks their devices):
    call ``shutdown()``, or use the LLM as a context manager, to stop them."""

    def __init__(self, model: str, dtype: str = "float32", **overrides: object) -> None:
        unknown = set(overrides) - EngineConfig.field_names()
        check(not unknown, "LLM keyword", f"one of {sorted(EngineConfig.field_names())}", sorted(unknown))
        # Defaults that depend on an overridden key follow it instead of contradicting it.
        if "max_batch_size" in overrides:
            overrides.setdefault("max_prefill_batch_size", min(50, int(overrides["max_batch_size"])))  # type: ignore[arg-type]
        if "max_seq_len" in overrides:
            overrides.setdefault("max_iter_times", min(512, int(overrides["max_seq_len"])))  # type: ignore[arg-type]
        # Offline, preempt whenever blocks run out (vLLM's behaviour, the most throughput from a small pool);
        # MindIE's default 0 (no preemption: admit with blocks reserved for the whole output) is the server's.
        overrides.setdefault("max_preempt_count",
                             int(overrides.get("max_batch_size", EngineConfig.max_batch_size)))  # type: ignore[arg-type]
        overrides.setdefault("max_queue_delay_microseconds", 0)  # every prompt is queued before the first step
        show_progress()
        t0 = time.monotonic()
        logger.info("LLM: loading %s (%s)", model, dtype)
        self.engine = LLMEngine(EngineConfig(model=str(model), dtype=dtype, **overrides))  # type: ignore[arg-type]
        self.tokenizer = self.engine.tokenizer
        self.input_processor = InputProcessor.from_facts(input_facts(self.engine))
        self._ids = itertools.count()
        self.pooling = engine_pooling(self.engine)  # tasks, pooling (engine.pooling)
        self.engine.runner.idle()  # what building the engine and its input processor freed, out of the RSS (issue 44)
        logger.info("LLM: %s ready in %.1f s", model, time.monotonic() - t0)

    def shutdown(self) -> None:
        """Stop the engine's worker ranks (tensor parallelism); a no-op for one rank."""
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def generate(self, prompts: str | dict | Seq[str | dict] | Seq[list[int]],
                 params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = True, adapter_id: str | None = None) -> list[RequestOutput]:
        """A prompt is a string, a list of token ids, or (multimodal checkpoints) ``{"parts": [...]}``: the
        user message's parts in order, e.g. ``[{"type": "image", "image": pil}, {"type": "text", "text": "?"}]``
        (also ``{"type": "video", "video": [frames]}``, ``{"type": "audio", "audio": wav, "sampling_rate": sr}``;
        see mindie_service.models.media_encoders). Parts are rendered with the processor's chat template."""
        check_task(self.pooling.tasks, "generate", self.engine.cfg.model_name or self.engine.cfg.model)
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)
        plist = list(params) if isinstance(params, (list, tuple)) else [params or SamplingParams()] * len(prompts)
        check(len(plist) == len(prompts), "params", f"one SamplingParams or a list of {len(prompts)}", len(plist))
        # Every request is checked before any is queued: a bad prompt fails the call without running the others.
        requests: list[EngineRequest] = []
        for prompt, p in zip(prompts, plist):
            if adapter_id is not None:
                p = replace(p, adapter_id=adapter_id)
            requests.append(self.input_processor.process(_prompt(prompt), p, request_id=f"offline-{next(self._ids)}"))
        arrival = time.time()
        seeds = {req.request_id: self.engine.add_request(req).seed for req in requests}
        times = {req.request_id: {"arrival_time": arrival} for req in requests}
        results = self._run({req.request_id: GenerationResult() for req in requests}, use_tqdm, times)
        self.engine.runner.idle()  # the run's workspaces and freed heap out of the RSS (issue 44)
        return [_output(prompt, req, results[req.request_id], seeds[req.request_id], times[req.request_id])
                for prompt, req in zip(prompts, requests)]

    def embed(self, inputs: str | Seq[str] | Seq[list[int]], dimensions: int | None = None) -> list[list[float]]:
        """One embedding per input (a text or a list of token ids), pooled as the checkpoint says
        (models/pooling_spec.py); ``dimensions``: Matryoshka truncation where the model allows it."""
        items = [inputs] if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)) else list(inputs)
        facts = self.input_processor_facts()
        return self._pool(PoolRequest(f"offline-{next(self._ids)}", pool_inputs(facts, items), "embed", dimensions))

    def score(self, text_1: str, text_2: str | Seq[str]) -> list[float]:
        """Relevance of each ``text_2`` to ``text_1`` from a one-label sequence classifier (a cross-encoder)."""
        docs = [text_2] if isinstance(text_2, str) else list(text_2)
        ins = pair_inputs(self.input_processor_facts(), [(text_1, d) for d in docs])
        return [v[0] for v in self._pool(PoolRequest(f"offline-{next(self._ids)}", ins, "score"))]

    def input_processor_facts(self) -> Any:
        return input_facts(self.engine)

    def _pool(self, req: PoolRequest) -> list[list[float]]:
        check_pool_request(self.pooling, req, self.engine.cfg.model_name or self.engine.cfg.model)
        batcher = self.pooling.batcher
        assert batcher is not None  # the check passed: the engine pools
        batcher.add(req)
        while True:
            for _, got in batcher.step(self.engine.has_work()):
                if isinstance(got, Exception):
                    raise got
                return got.vectors

    def _run(self, results: dict[str, GenerationResult], use_tqdm: bool,
             times: dict[str, dict[str, float]]) -> dict[str, GenerationResult]:
        """Step the engine until every request has finished, folding each one's events (GenerationResult.add,
        the serving core's fold) and stamping each request's first and last token in ``times``."""
        bar = None
        if use_tqdm and len(results) > 1:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(results), desc="generate", unit="req")
        pending = set(results)
        failures: list[str] = []
        while pending:
            events = self.engine.step()
            now = time.time()
            for ev in events:
                if isinstance(ev, FailedEvent):
                    failures.append(f"{ev.request_id}: {ev.message}")
                    pending.discard(ev.request_id)
                    continue
                results[ev.request_id].add(ev)
                times[ev.request_id].setdefault("first_token_time", now)
                times[ev.request_id]["last_token_time"] = now
                if ev.finish_reason is not None:
                    pending.discard(ev.request_id)
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        if failures:
            raise GenerationError("; ".join(failures))
        return results


def _output(prompt: Any, req: EngineRequest, result: GenerationResult, seed: int | None,
            metrics: dict[str, float]) -> RequestOutput:
    """A request's folded result in the offline API's shape."""
    toks = result.tokens
    logprobs = ([{t.id: t.logprob, **{a.id: a.logprob for a in t.top}} for t in toks]
                if req.params.logprobs is not None else None)
    out = CompletionOutput(0, result.text, [t.id for t in toks], result.finish_reason,
                           sum((t.logprob for t in toks if t.logprob is not None), 0.0), logprobs,
                           result.full_reasoning)
    prompt_lps = [t.logprob for t in result.prompt_tokens] if req.params.prompt_logprobs else None
    return RequestOutput(req.request_id, prompt if isinstance(prompt, str) else None, list(req.prompt_token_ids),
                         [out], prompt_logprobs=prompt_lps, seed=seed, metrics=metrics)


def _prompt(prompt: Any) -> Prompt:
    """A string, a list of token ids, or ``{"parts": [...]}`` -> the input processor's prompt."""
    if isinstance(prompt, dict):
        check(isinstance(prompt.get("parts"), (list, tuple)), "prompt", 'a dict {"parts": [...]}', sorted(prompt))
        return PartsPrompt(tuple(prompt["parts"]))
    if isinstance(prompt, str):
        check(prompt.strip() != "", "prompt", "a non-empty string", prompt)
        return TextPrompt(prompt)
    check(isinstance(prompt, (list, tuple)) and len(prompt) > 0, "prompt", "a non-empty string or list of ids", prompt)
    return TokensPrompt(tuple(prompt))
