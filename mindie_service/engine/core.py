"""The synchronous engine: wiring, and the step (``mindie_service.engine.step`` is its contract).

    out = scheduler.schedule()              plain data: each request's tokens to compute this step
    result = runner.execute(out)            one forward; logits of the rows that sample
    tokens = sampler.sample(...)            next token of each sampling row
    events = outputs.token(...)             detokenize, decide finishes (EOS, stop strings, caps)
    scheduler.update(out, tokens, finishes) counters, prefix-cache blocks, finished requests freed

A request that makes the step raise fails alone: the step is re-run one request at a time and
only the requests that still fail get a FailedEvent. Single-threaded by design: the async facade
runs it in one dedicated thread and nothing else touches model state."""
from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from mindie_service.engine.sample.beam import BeamSearch, check_beam_request
from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.runner.engine_parts import load_parts
from mindie_service.engine.kv.kv_event_types import BlockEventSink, FanOutSink
from mindie_service.engine.sample.grammar_masks import FailHook, ForceHook, GrammarFailed, GrammarMasks, fail_event
from mindie_service.engine.output.output_processor import OutputProcessor
from mindie_service.engine.output.stop_rule import ban_early_stops
from mindie_service.engine.runner.parallel.launcher import ParallelRunner, RankGroup
from mindie_service.engine.runner.model_runner import ModelRunner, kv_bytes_per_block
from mindie_service.engine.sched.bursts import BurstPacer
from mindie_service.engine.sample.sampler import LOGPROB_FLOOR, NonFiniteRows, SampleResult, Sampler
from mindie_service.engine.sched.sched_stats import scheduler_stats
from mindie_service.engine.sched.scheduler import Scheduler
from mindie_service.engine.sequence import Sequence, SequenceGroup, SeqStatus
from mindie_service.engine.sessions.session_store import SessionStore
from mindie_service.engine.sample.spec_accept import row_dists
from mindie_service.engine.spec.speculator import build_speculator, draft_block_bytes, verify_rows
from mindie_service.engine.step import ModelOutput, ScheduledChunk, SchedulerOutput
from mindie_service.engine.kv.swap import HostBlockPool, host_pool_blocks
from mindie_service.engine.contract import EngineRequest, EngineStats, FailedEvent, TokenEvent
from mindie_service.errors import EngineDeadError, check
from mindie_service.lora.manager import LoraManager
from mindie_service.params.output_cap import output_cap
from mindie_service.structured.compiler import build_compiler

if TYPE_CHECKING:
    from torch import Tensor

logger = logging.getLogger(__name__)

Event = TokenEvent | FailedEvent
# How often a held prefill batch (maxQueueDelayMicroseconds) looks at the inbox for new prompts.
QUEUE_DELAY_TICK_S = 0.001
_Outcome = tuple[SchedulerOutput, ModelOutput, SampleResult]


class LLMEngine:
    step_clock: Callable[[], float] = time.perf_counter  # times steps and drafts (burst pacer, speculation policy)

    def __init__(self, cfg: EngineConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        # worldSize > 1: start (or wait for) the worker ranks; this process is rank 0 (engine.runner.parallel).
        self.ranks = RankGroup(cfg) if cfg.world_size > 1 else None
        try:
            self._build(cfg)
        except BaseException as exc:
            if self.ranks is not None:
                self.ranks.start_failed(exc)
            raise
        if self.ranks is not None:
            self.ranks.handshake(self.blocks.num_blocks, self.runner.host_blocks)
            self.runner = ParallelRunner(self.runner, self.ranks, self.lora)

    def _build(self, cfg: EngineConfig) -> None:
        draft = partial(draft_block_bytes, cfg.speculative_config, cfg.dtype, cfg.cache_block_size)
        parts = load_parts(cfg, self.ranks.shard if self.ranks is not None else None, draft)
        self.device_info, self.device = parts.device_info, parts.device_info.torch_device
        loaded = parts.loaded
        self.model, self.hf_config, self.dtype, self.architecture = (loaded.model, loaded.hf_config, loaded.dtype,
                                                                     loaded.architecture)
        self.mm_encoder = loaded.encoder  # media encoders + processor of a multimodal checkpoint; else None
        self.tokenizer, self.eos_token_ids = parts.tokenizer, parts.eos_token_ids
        self.vocab_size = int(self.model.dims.vocab)
        self.blocks = BlockManager(parts.num_blocks, cfg.cache_block_size, cfg.enable_prefix_caching)
        self.kv_events = None  # BackendConfig.kvEventsConfig: the prefix cache's changes over ZMQ (engine.kv.kv_events)
        if cfg.kv_events is not None and cfg.kv_events.active:
            from mindie_service.engine.kv.kv_events import KVEvents  # pyzmq only when switched on
            self.kv_events = KVEvents(cfg.kv_events, cfg.cache_block_size)
            self.add_block_sink(self.kv_events.recorder)
        self.lora = LoraManager(self.model, cfg.max_loras, cfg.max_lora_rank, self.device, self.dtype,
                                [(m.name, m.path) for m in cfg.lora_modules], reserved=(cfg.model_name,))
        self.sessions = SessionStore(self.blocks, max_sessions=cfg.max_sessions, kv_share=cfg.session_kv_share,
                                     idle_seconds=cfg.session_idle_seconds, max_tokens=cfg.max_session_tokens)
        # cpuMemSize: the host pool for swapped-out K/V (its tensor is allocated at the first swap).
        host = HostBlockPool(host_pool_blocks(
            cfg.swap_space_gb, kv_bytes_per_block(self.model, cfg.cache_block_size, self.dtype, cfg.kv_cache_dtype),
            cfg.max_batch_size * self.blocks.blocks_needed(cfg.max_seq_len)))
        self.scheduler = Scheduler(cfg, self.blocks, adapters=self.lora, sessions=self.sessions, host=host,
                                   clock=time.monotonic)
        self.runner = ModelRunner(self.model, parts.num_blocks, cfg.cache_block_size, self.device, self.dtype,
                                  lora_hook=self.lora.step_applier,
                                  embeds_hook=self.mm_encoder.embeds_hook if self.mm_encoder else None,
                                  host_blocks=host.num_blocks, graphs=parts.graphs)
        self.sampler = Sampler()
        self.outputs = OutputProcessor(self.tokenizer, self.eos_token_ids, cfg.structured.reasoning_parser)
        self.beams = BeamSearch(self.scheduler, self.outputs, self.eos_token_ids, self.sessions)
        self.spec = build_speculator(cfg.speculative_config, cfg, self.device, parts.num_blocks, self.vocab_size,
                                     self.tokenizer)
        # bursts (engine.sched.bursts) paced by step_clock; none beside verify steps or with ranks (they step alike)
        self.bursts = BurstPacer(1 if self.spec is not None or self.ranks is not None else cfg.decode_steps)
        self._done: dict[str, Sequence] = {}  # requests finished this step (the speculator learns their text)
        self.spill = None  # ScheduleConfig.sessionSpillDir: kept sessions on disk (engine.sessions.session_spill)
        if cfg.session_spill_dir and cfg.world_size == 1 and self.sessions.enabled:
            from mindie_service.engine.sessions.session_spill import SessionSpill, model_identity, spill_cap
            pool = self.runner.kv_pool
            identity = model_identity(cfg.model, str(self.dtype), cfg.cache_block_size, cfg.kv_cache_dtype, pool)
            self.spill = SessionSpill(self.blocks, self.sessions, pool, identity, cfg.session_spill_dir,
                                      spill_cap(pool, self.blocks, cfg.max_seq_len))
            self.sessions.on_evict = self.spill.on_evict
            self.spill.restore_all()
        self.grammar = GrammarMasks(build_compiler(self.tokenizer, self.eos_token_ids, cfg.structured, self.vocab_size),
                                   self.vocab_size, self.eos_token_ids, cfg.structured.forced_runs,
                                   cfg.structured.overlap_fill)

    @property
    def pool_tokens(self) -> int:
        return self.blocks.num_blocks * self.cfg.cache_block_size

    # ------------------------------------------------------------ requests
    def add_request(self, req: EngineRequest) -> Sequence:
        """Queue a request the input processor built (its prompt is trusted); the checks left: its adapter, its budget."""
        rid, ids = req.request_id, list(req.prompt_token_ids)
        check(self.scheduler.get(rid) is None, "request_id", "unique among running requests", rid)
        # Not the input-length rule (the processor's): a prompt the pool cannot hold would wait forever.
        check(0 < len(ids) < self.pool_tokens, "inputs", f"1 to {self.pool_tokens - 1} tokens (the KV pool)",
              len(ids))
        cache_key = b"|mm:" + ",".join(req.mm_hashes).encode() if req.mm_hashes else b""  # media never share KV
        p = req.params
        max_output = output_cap(p.max_tokens, len(ids), max_iter_times=self.cfg.max_iter_times,
                                max_seq_len=self.cfg.max_seq_len, pool_tokens=self.pool_tokens)
        seed = p.seed if p.seed is not None else secrets.randbits(63)
        if p.num_beams > 1:
            check_beam_request(req, max(1, max_output), self.blocks.blocks_needed, self.blocks.num_blocks,
                               self.cfg.max_batch_size)
        seq = Sequence(rid, ids, p, max(1, max_output), seed, cache_key=cache_key, mm_inputs=req.mm_inputs,
                       priority=req.priority, rank=req.rank, session_id=req.session_id if self.sessions.enabled else None)
        self.outputs.check(p)  # a thinking budget needs a model that thinks
        self.grammar.attach(seq)  # its matcher, from the compile cache (the input processor compiled it)
        seq.cache_key = self.lora.bind(rid, p.adapter_id) + cache_key  # last check: counts the request
        if req.continued and req.session_id is not None:
            self.sessions.continued(req.session_id)
        self.outputs.add(seq)
        if p.num_beams > 1:
            self.beams.add(seq)  # its beams are scheduled; seq itself only carries the request
        else:
            self.scheduler.add(seq)
        return seq

    def abort_request(self, request_id: str) -> bool:
        """Abort the client's ``request_id``, or the whole group (beam search) of the member it names."""
        if self.beams.abort(request_id):
            return True
        seq = self.scheduler.get(request_id)
        if seq is None:
            return False
        if seq.group is not None:
            return self.beams.abort(seq.group.request_id)
        self.scheduler.finish(seq)
        self.sampler.forget(request_id)
        self.outputs.drop(request_id)
        if self.spec is not None:
            self.spec.finished(seq)
        return True

    def has_work(self) -> bool:
        return self.scheduler.has_work() or (self.spill is not None and self.spill.pending())

    # ------------------------------------------------------------ LoRA adapters (thread-safe)
    def load_adapter(self, name: str, path: str) -> dict:
        """ConflictError (409) when the name is taken, ValidationError (422) for a bad folder or rank."""
        if self.ranks is not None:  # every rank loads it, ahead of any step that may use it
            return self.ranks.with_control(lambda: self.lora.load(name, path), ("lora_load", name, path))
        return self.lora.load(name, path)

    def unload_adapter(self, name: str) -> None:
        """NotFoundError (404) when unknown, ConflictError (409) while requests use it."""
        if self.ranks is not None:
            self.ranks.with_control(lambda: self.lora.unload(name), ("lora_unload", name))
            return
        self.lora.unload(name)

    def check_alive(self) -> None:
        """EngineDeadError when a tensor-parallel rank has died (the engine thread asks while idle)."""
        if self.ranks is not None:
            self.ranks.check_alive()

    def add_block_sink(self, sink: BlockEventSink) -> None:
        """Tell ``sink`` of every block hash entering or leaving the prefix cache (engine thread, in the step)."""
        cur = self.blocks.events
        self.blocks.events = sink if cur is None else FanOutSink([cur, sink])

    def shutdown(self) -> None:
        """Spill the kept sessions (sessionSpillDir), stop the KV-event publisher and the worker ranks of a
        tensor-parallel engine. Called once the engine thread has stopped."""
        if self.spill is not None:
            self.spill.spill_all()
        if self.kv_events is not None:
            self.kv_events.shutdown()
        if self.ranks is not None:
            self.ranks.close()

    def list_adapters(self) -> list[dict]:
        return self.lora.list()

    def stats(self) -> EngineStats:
        """Read off the engine thread (engine.sched.sched_stats copes with queues that change meanwhile)."""
        q, ss, b, cfg = scheduler_stats(self.scheduler.running, self.scheduler.waiting, self.scheduler.swapped,
                                        self.scheduler.num_preemptions), self.sessions.stats(), self.blocks, self.cfg
        kv = self.kv_events.stats() if self.kv_events is not None else None
        return EngineStats(running=q.running, waiting=q.waiting, swapped=q.swapped, total_blocks=b.num_blocks,
                           free_blocks=b.num_free_blocks, cache_usage=b.usage, prefix_cache_hit_rate=b.prefix_hit_rate,
                           num_preemptions=q.num_preemptions, sessions_held=ss.held, session_hits=ss.hits,
                           session_evictions=ss.evictions, session_pinned_blocks=ss.pinned_blocks,
                           batch_running=q.batch_running, batch_waiting=q.batch_waiting,
                           running_adapters=q.running_adapters, waiting_adapters=q.waiting_adapters,
                           host_blocks=self.scheduler.host.num_blocks if self.scheduler.host else 0,
                           kv_events_published=kv.published_batches if kv else 0,
                           kv_events_dropped=kv.dropped_batches if kv else 0, block_size=cfg.cache_block_size,
                           max_loras=cfg.max_loras, kv_cache_dtype=cfg.kv_cache_dtype,
                           prefix_caching=cfg.enable_prefix_caching, kv_pool_bytes=self.runner.kv_pool_bytes,
                           **(self.spec.counters.stats_fields() if self.spec is not None else {}))

    # ------------------------------------------------------------ the step
    def step(self) -> list[Event]:
        if self.spill is not None and self.spill.pending():  # sessions imported from another replica
            self.spill.apply_pending()
        events = self._step()
        if self.kv_events is not None:  # this step's prefix-cache changes: one batch, never waited for
            self.kv_events.end_step()
        return events

    def _step(self) -> list[Event]:
        self.sessions.expire()
        if self.spec is not None:
            self.spec.propose(self.scheduler.running, self.step_clock)
        out = self.scheduler.schedule()
        if out.empty:
            if out.has_swaps:  # no forward this step, but the decided copies must run before the next
                self.runner.apply_swaps(out)
            if out.hold_s > 0:  # new prompts wait for company (maxQueueDelayMicroseconds); look again soon
                time.sleep(min(out.hold_s, QUEUE_DELAY_TICK_S))
            return []
        t0 = self.step_clock()
        outcomes, events = self._execute(out)
        spent = self.step_clock() - t0
        if self.spec is not None:
            self.spec.observe_step(out.num_tokens, spent)
        if out.num_decodes == len(out.chunks):  # a decode-only step paces the bursts
            self.scheduler.decode_steps = self.bursts.observe(spent, out.chunks[0].steps)
        sampled: dict[str, list[int]] = {}
        finished: dict[str, str] = {}
        beam_rows: dict[SequenceGroup, dict[Sequence, Tensor]] = {}
        for sub, result, sample in outcomes:
            for chunk in sub.prefills:
                logits = result.prompt_logits.get(chunk.request_id)
                if logits is not None:
                    self.outputs.prompt_chunk(self.scheduler.seqs[chunk.request_id], chunk, logits)
            row = 0
            for chunk in sub.sampled:
                row, first = row + chunk.out_rows, row
                seq = self.scheduler.seqs.get(chunk.request_id)
                if seq is None:  # a beam whose search failed during the step
                    continue
                if seq.group is not None:  # beams are ranked together, after the update
                    beam_rows.setdefault(seq.group, {})[seq] = result.logits[first]
                    continue
                events.extend(self._emit(seq, chunk, sample, first, sampled, finished))
        self.scheduler.update(out, sampled, finished)
        if self.spec is not None:
            for rid in finished:
                self.spec.finished(self._done[rid])
            self._done.clear()
        self.grammar.after_step(self.scheduler.seqs, sampled, *self._grammar_hooks(events))
        for group, rows in beam_rows.items():
            if self.beams.searching(group):
                events.extend(self.beams.advance(group, rows))
        return events

    def _grammar_hooks(self, events: list[Event]) -> tuple[ForceHook, FailHook]:
        """``GrammarMasks.after_step``'s ``force(seq, t)`` (append a token the grammar forces; False: it could not,
        or the stop rule ended the request) and ``fail(seq, why)``; their events go to ``events``."""
        def force(seq: Sequence, t: int) -> bool:
            if seq.status is SeqStatus.RUNNING:  # slots for every token up to t (the sampled one has none yet)
                if not self.blocks.slots_for(seq, seq.num_tokens + 1):
                    return False
            elif seq.status is not SeqStatus.WAITING or seq.block_table:
                return False
            ev = self.outputs.token(seq, t, 0.0, [])
            events.append(ev)
            if ev.finish_reason is not None:
                self.scheduler.finish(seq, ev.finish_reason)
                self.sampler.forget(seq.request_id)
                return False
            seq.output_token_ids.append(t)
            return True

        def fail(seq: Sequence, why: str) -> None:
            logger.warning("request %s: structured output failed (%s)", seq.request_id, why)
            self.abort_request(seq.request_id)
            events.append(fail_event(seq.request_id, why))

        return force, fail

    def _emit(self, seq: Sequence, chunk: ScheduledChunk, sample: SampleResult, first: int,
              sampled: dict[str, list[int]], finished: dict[str, str]) -> list[TokenEvent]:
        """The events of one sampling chunk: one token, or a verify chunk's accepted run (engine.spec.speculator),
        cut at the token that finishes the request."""
        tokens = sample.token_ids[first:first + chunk.out_rows]
        run = self.spec.accept(seq, chunk, tokens) if chunk.num_draft else tokens
        kept: list[int] = []
        events: list[TokenEvent] = []
        for i, tid in enumerate(run):
            ev = self.outputs.token(seq, tid, sample.logprobs[first + i], sample.top[first + i], pending=i)
            kept.append(tid)
            events.append(ev)
            if ev.finish_reason is not None:
                finished[chunk.request_id] = ev.finish_reason
                self.sampler.forget(chunk.request_id)
                if self.spec is not None:
                    self._done[chunk.request_id] = seq
                break
        sampled[chunk.request_id] = kept
        return events

    def _run(self, out: SchedulerOutput) -> _Outcome:
        # structured output: this step's missing masks fill on the fill thread during the forward (overlapFill)
        self.grammar.start_fill([self.scheduler.seqs[c.request_id] for c in out.sampled])
        try:
            result = self.runner.execute(out)
        finally:
            self.grammar.join_fill()
        if result.tokens is not None:  # a multi-step burst (engine.sched.bursts): its rows' greedy tokens
            lps, n = result.token_logprobs or [], len(result.tokens[0])
            if n < out.chunks[0].steps:  # cut short (a step's logits not finite): every row ran n steps
                out = replace(out, chunks=[replace(c, steps=n) for c in out.chunks])
            return out, result, SampleResult([t for run in result.tokens for t in run],
                                             [max(v, LOGPROB_FLOOR) for run in lps for v in run],
                                             [[] for run in result.tokens for _ in run])
        chunks = out.sampled
        rows, drafts = verify_rows(chunks, [self.scheduler.seqs[c.request_id] for c in chunks])
        if not rows:
            return out, result, SampleResult([], [], [])
        # grammar masks (a verify row's after its drafts), then min_tokens' bans: before every penalty and warp
        logits = ban_early_stops(self.grammar.mask_logits(result.logits, rows), rows, self.eos_token_ids)
        # drafts only for a step that verifies some: a plain step calls sample(logits, rows) as it always did
        qs = row_dists(chunks, self.spec.draft) if drafts and self.spec is not None else None  # a sampled draft's q
        return out, result, self.sampler.sample(logits, rows, **({"drafts": drafts} if drafts else {}),
                                                **({"draft_probs": qs} if qs else {}))

    def _execute(self, out: SchedulerOutput) -> tuple[list[_Outcome], list[Event]]:
        """Run the step; if it raises, run each request alone and fail only those that still raise."""
        try:
            return [self._run(out)], []
        except EngineDeadError:
            raise  # nothing to isolate: the engine itself is gone
        except Exception as exc:  # noqa: BLE001 - isolate the request that broke the batch
            logger.warning("step of %d requests failed (%s); retrying each alone", len(out.chunks), exc)
        # The sampler draws nothing (and restores its generators) when it raises, so re-running a seeded
        # request alone gives the very tokens it would have drawn in the batch.
        outcomes: list[_Outcome] = []
        failed: list[Event] = []
        # A member that fails fails its whole group (a beam search): its event goes to the client's id.
        clients = {c.request_id: self._client_id(c.request_id) for c in out.chunks}
        for chunk in out.chunks:
            rid, cid = chunk.request_id, clients[chunk.request_id]
            try:
                outcomes.append(self._run(out.only(chunk)))
            except EngineDeadError:
                raise
            except GrammarFailed as e:
                self.abort_request(rid)
                failed.append(fail_event(cid, e.reasons.get(rid, str(e))))
            except NonFiniteRows:
                logger.warning("request %s: non-finite logits, failing it", rid)
                self.abort_request(rid)
                failed.append(FailedEvent(cid, f"Request {cid} failed: the model produced non-finite logits (NaN or "
                                               f"infinity) for it; its sampling parameters or LoRA adapter overflowed"))
            except Exception:  # noqa: BLE001 - the details go to the log, never to the client
                logger.exception("request %s failed in the engine", rid)
                self.abort_request(rid)
                failed.append(FailedEvent(cid, f"Request {cid} failed in the engine"))
        return outcomes, failed

    def _client_id(self, request_id: str) -> str:
        """The client's id of a scheduled sequence: its group's for a member (a beam), else its own."""
        seq = self.scheduler.get(request_id)
        return seq.group.request_id if seq is not None and seq.group is not None else request_id
