"""The synchronous engine: one step = schedule() -> execute(batch) -> sample -> postprocess.

Single-threaded by design: the async facade runs it in one dedicated thread and nothing else
touches model state."""
from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass, replace

import torch
from transformers import AutoTokenizer

from mindie_service.engine.block_manager import BlockManager
from mindie_service.engine.config import EngineConfig
from mindie_service.engine.detokenizer import DetokState, TokenDecoder, flush, step as detok_step
from mindie_service.engine.runner import ModelRunner, StepResult, kv_bytes_per_block
from mindie_service.engine.sampler import SampleResult, Sampler
from mindie_service.engine.scheduler import Scheduler, SchedulerOutput
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.types import (FINISH_EOS, FINISH_LENGTH, FINISH_STOP, EngineRequest, EngineStats,
                                         FailedEvent, TokenEvent, TokenInfo)
from mindie_service.lora.manager import LoraManager
from mindie_service.models.loader import load_model
from mindie_service.errors import check
from mindie_service.protocol.validation import fit_prompt
from npu_ops import cpu_kernels
from npu_ops.device import select_device

logger = logging.getLogger(__name__)

Event = TokenEvent | FailedEvent


@dataclass
class _Tracked:
    seq: Sequence
    detok: DetokState
    first_event_sent: bool = False


class LLMEngine:
    def __init__(self, cfg: EngineConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.device_info = select_device(cfg.device)
        if self.device_info.type == "cpu":
            self.device_info = replace(self.device_info, reason=f"{self.device_info.reason}; {cpu_kernels.describe()}")
        self.device = self.device_info.torch_device
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        loaded = load_model(cfg.model, cfg.dtype, self.device, cfg.max_seq_len, min(cfg.max_batch_size, 128))
        self.model, self.hf_config, self.dtype = loaded.model, loaded.hf_config, loaded.dtype
        self.architecture = loaded.architecture
        # Media encoders + processor of a multimodal checkpoint (models/multimodal.py); None for text models.
        self.mm_encoder = loaded.encoder
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model, trust_remote_code=cfg.trust_remote_code)
        self.vocab_size = int(self.model.dims.vocab)
        self.eos_token_ids = self._eos_ids()
        num_blocks = cfg.num_kv_blocks or self._auto_num_blocks()
        self.blocks = BlockManager(num_blocks, cfg.cache_block_size, cfg.enable_prefix_caching)
        self.lora = LoraManager(self.model, cfg.max_loras, cfg.max_lora_rank, self.device, self.dtype, cfg.lora_modules,
                                reserved=(cfg.model_name,))
        self.scheduler = Scheduler(cfg, self.blocks, adapters=self.lora)
        self.runner = ModelRunner(self.model, num_blocks, cfg.cache_block_size, self.device, self.dtype)
        if self.mm_encoder is not None:
            self.runner.embeds_hook = self.mm_encoder.embeds_hook
        self.runner.lora_hook = self.lora.step_applier
        self.sampler = Sampler()
        self.decoder = TokenDecoder(self.tokenizer)
        self.tracked: dict[str, _Tracked] = {}
        logger.info("KV pool: %d blocks of %d tokens", num_blocks, cfg.cache_block_size)

    # ------------------------------------------------------------ set-up helpers
    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for src in (getattr(self.hf_config, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(src, int):
                ids.add(src)
            elif isinstance(src, (list, tuple)):
                ids.update(int(i) for i in src)
        return frozenset(ids)

    def _auto_num_blocks(self) -> int:
        per_block = kv_bytes_per_block(self.model, self.cfg.cache_block_size, self.dtype)
        need = self.cfg.max_batch_size * self.cfg.max_seq_len // self.cfg.cache_block_size + 1
        if self.cfg.kv_cache_memory_gb > 0:
            budget = int(self.cfg.kv_cache_memory_gb * 2**30)
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info()
            budget = int(free * 0.8)
        else:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            budget = min(int(avail * 0.25), 4 * 2**30)
        return max(2, min(need, budget // per_block))

    @property
    def pool_tokens(self) -> int:
        return self.blocks.num_blocks * self.cfg.cache_block_size

    # ------------------------------------------------------------ requests
    def check_prompt(self, ids: list[int], truncate: int | None = None) -> list[int]:
        """Apply ``truncate`` (keep the last N) and the input-length limit; ValidationError when too long."""
        check(len(ids) > 0, "inputs", "non-empty after tokenization", len(ids))
        limit = min(self.cfg.effective_max_input_len, self.pool_tokens - 1)
        return fit_prompt(ids, truncate, limit, self.cfg.truncation)

    def add_request(self, req: EngineRequest, cache_key: bytes = b"") -> Sequence:
        """Queue a request. ``cache_key`` carries media hashes; the LoRA adapter named by
        ``params.adapter_id`` is resolved here (unknown -> ValidationError) and its identity prefixed."""
        check(req.request_id not in self.tracked, "request_id", "unique among running requests", req.request_id)
        ids = self.check_prompt(list(req.prompt_token_ids))
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        check(not bad, "inputs", f"token ids in [0, {self.vocab_size})", bad[:3])
        if self.mm_encoder is not None:
            self.mm_encoder.check_prompt(ids, req.mm_inputs)
        else:
            check(req.mm_inputs is None, "inputs", "text only (this model takes no media)", "media parts")
        if req.mm_hashes:  # identical tokens with different media must never share KV blocks
            cache_key += b"|mm:" + ",".join(req.mm_hashes).encode()
        p = req.params
        max_output = min(p.max_tokens, self.cfg.max_iter_times, self.cfg.max_seq_len - len(ids),
                         self.pool_tokens - len(ids))
        seed = p.seed if p.seed is not None else secrets.randbits(63)
        cache_key = self.lora.bind(req.request_id, p.adapter_id) + cache_key  # last check: counts the request
        seq = Sequence(req.request_id, ids, p, max(1, max_output), seed, cache_key=cache_key,
                       mm_inputs=req.mm_inputs)
        self.tracked[req.request_id] = _Tracked(seq, DetokState.start(ids, p.stop))
        self.scheduler.add(seq)
        return seq

    def abort_request(self, request_id: str) -> bool:
        t = self.tracked.pop(request_id, None)
        if t is None:
            return False
        t.seq.aborted = True
        self.scheduler.finish(t.seq)
        self.sampler.forget(request_id)
        return True

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ------------------------------------------------------------ LoRA adapters (thread-safe)
    def load_adapter(self, name: str, path: str) -> dict:
        """ConflictError (409) when the name is taken, ValidationError (422) for a bad folder or rank."""
        return self.lora.load(name, path)

    def unload_adapter(self, name: str) -> None:
        """NotFoundError (404) when unknown, ConflictError (409) while requests use it."""
        self.lora.unload(name)

    def list_adapters(self) -> list[dict]:
        return self.lora.list()

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self.scheduler.running), waiting=len(self.scheduler.waiting), swapped=0,
                           total_blocks=self.blocks.num_blocks, free_blocks=self.blocks.num_free_blocks,
                           cache_usage=self.blocks.usage, prefix_cache_hit_rate=self.blocks.prefix_hit_rate,
                           num_preemptions=self.scheduler.num_preemptions)

    # ------------------------------------------------------------ the step
    def _run(self, sched: SchedulerOutput) -> tuple[StepResult, SampleResult]:
        result = self.runner.execute(sched)
        return result, self.sampler.sample(result.logits, result.seqs)

    def step(self) -> list[Event]:
        sched = self.scheduler.schedule()
        if sched.empty:
            return []
        try:
            outcomes = [self._run(sched)]
            failed: list[tuple[Sequence, str]] = []
        except Exception as exc:  # noqa: BLE001 - isolate the request that broke the batch
            logger.warning("step of %d sequences failed (%s); retrying each alone", len(sched.seqs), exc)
            outcomes, failed = [], []
            for seq in sched.seqs:
                single = SchedulerOutput(decodes=[seq] if seq in sched.decodes else [],
                                         prefills=[seq] if seq in sched.prefills else [])
                try:
                    outcomes.append(self._run(single))
                except Exception as one_exc:  # noqa: BLE001
                    logger.exception("request %s failed in the engine", seq.request_id)
                    failed.append((seq, f"{type(one_exc).__name__}: {one_exc}"))
        events: list[Event] = []
        for seq, message in failed:
            self.abort_request(seq.request_id)
            events.append(FailedEvent(seq.request_id, f"Request failed in the engine: {message}"))
        for result, sample in outcomes:
            for row, seq in enumerate(result.seqs):
                events.append(self._postprocess(seq, row, result, sample))
        return events

    def _token_info(self, tid: int, logprob: float | None, top: list[tuple[int, float]] = ()) -> TokenInfo:
        return TokenInfo(tid, logprob, self.decoder.token_text(tid), tid in self.decoder.special_ids,
                         tuple(TokenInfo(i, lp, self.decoder.token_text(i), i in self.decoder.special_ids)
                               for i, lp in top))

    def _prompt_infos(self, seq: Sequence, result: StepResult) -> list[TokenInfo]:
        logits = result.prompt_logits.get(seq.request_id)
        lps: list[float | None] = [None] * seq.num_prompt_tokens
        if logits is not None:
            nxt = torch.tensor(seq.prompt_token_ids[1:], device=logits.device)
            lps[1:] = logits.log_softmax(-1).gather(1, nxt[:, None])[:, 0].tolist()
        return [self._token_info(t, lp) for t, lp in zip(seq.prompt_token_ids, lps)]

    def _postprocess(self, seq: Sequence, row: int, result: StepResult, sample: SampleResult) -> TokenEvent:
        t = self.tracked[seq.request_id]
        seq.num_computed_tokens = seq.num_tokens
        self.blocks.register_computed(seq)
        tid = sample.token_ids[row]
        seq.output_token_ids.append(tid)
        delta = detok_step(self.decoder, t.detok, tid)
        finish = None
        if tid in self.eos_token_ids and not seq.params.ignore_eos:
            finish = FINISH_EOS
        elif t.detok.stopped:
            finish = FINISH_STOP
        elif len(seq.output_token_ids) >= seq.max_output:
            finish = FINISH_LENGTH
        ev = TokenEvent(seq.request_id, self._token_info(tid, sample.logprobs[row], sample.top[row]), delta,
                        len(seq.output_token_ids) - 1, finish)
        if not t.first_event_sent:
            t.first_event_sent = True
            ev.num_prompt_tokens, ev.seed = seq.num_prompt_tokens, seq.seed
            if seq.params.prompt_logprobs:
                ev.prompt_tokens = self._prompt_infos(seq, result)
        if finish is not None:
            ev.text_delta += flush(self.decoder, t.detok)
            ev.full_text = t.detok.text
            seq.finish_reason = finish
            self.scheduler.finish(seq)
            self.sampler.forget(seq.request_id)
            del self.tracked[seq.request_id]
        return ev
