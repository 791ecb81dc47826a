"""Runs batch jobs on the IO loop: each line through the serving core's input processing (chat template, media
guards), each generation through the engine at batch priority, folded by the serving core's one fold, each
result committed (jobs.store).

At most ``max_running`` generations of all jobs are in the engine at once (ServerConfig.batchMaxRunning).
A job resumes after a restart at the (line, generation) pairs not yet committed.

Each line holds its model from its input processing until its last generation ends, through the one door every
request takes (``hold``: loaded on demand; ``release`` after), with the job's ``keep_alive`` (Ollama's, taken at
submit): a model stop waits for the lines in flight only, never for the whole job, and idleness counts from the
last line's end. Lines overlap, so a running job keeps its model held."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Awaitable, Callable, Protocol

from mindie_service.engine.client import EngineClient
from mindie_service.engine.contract import FINISH_LENGTH, PRIORITY_BATCH, EngineRequest
from mindie_service.errors import MindieError, ValidationError
from mindie_service.jobs.lines import parse_line, split_lines
from mindie_service.jobs.store import JobRow, JobStore
from mindie_service.jobs.tasks import SlotTasks, TaskTable
from mindie_service.params.keep_alive import parse_keep_alive
from mindie_service.params.structured_field import read_structured
from mindie_service.sampling_params import SamplingParams
from mindie_service.serving import Frontend, fold

logger = logging.getLogger(__name__)

BAD_LINE = -1  # the generation number of a line's error record (the line never ran)


def job_params(job: JobRow) -> SamplingParams:
    o = job.options
    return SamplingParams(max_tokens=int(o["max_tokens"]), temperature=float(o["temperature"]),
                          top_p=float(o["top_p"]) if o["temperature"] > 0 else 1.0,
                          structured_outputs=read_structured(o, "job", "options."))


def job_keep_alive(job: JobRow) -> float | None:
    """The job's keep_alive (stored as seconds, -1 for Ollama's "keep loaded"), given to each line's hold."""
    v = job.options.get("keep_alive")
    return None if v is None else parse_keep_alive(v)


class HeldModel(Protocol):
    """A model held for one line (catalog.Target): its engine and the adapter the job's ``model`` names."""

    engine: EngineClient
    adapter_id: str | None


Hold = Callable[[str, "float | None"], Awaitable[HeldModel]]


class _LineHold:
    """One line's hold on its model, given back when the line's last generation task ends (cancelled ones too)."""

    def __init__(self, held: HeldModel, release: Callable[[HeldModel], None]) -> None:
        self.held, self._release, self._refs = held, release, 1  # the line's own reference, dropped after its loop

    def add(self, task: "asyncio.Future[None]") -> None:
        self._refs += 1
        task.add_done_callback(lambda _t: self.drop())

    def drop(self) -> None:
        self._refs -= 1
        if self._refs == 0:
            self._release(self.held)


class JobRunner:
    def __init__(self, store: JobStore, hold: Hold, release: Callable[[HeldModel], None], frontend: Frontend,
                 max_running: int) -> None:
        self.store, self.hold, self.release, self.frontend = store, hold, release, frontend
        self.max_running = max(1, max_running)
        self._slots = asyncio.Semaphore(self.max_running)
        self._tasks = TaskTable("batch")
        self.running_generations = 0  # batch sequences in the engine now (/v1/status, metrics)

    @property
    def slots(self) -> asyncio.Semaphore:
        """The batch slots (batchMaxRunning), shared with the OpenAI batches (jobs.batch_runner)."""
        return self._slots

    # ------------------------------------------------------------ lifecycle
    def start(self, job_id: str) -> None:
        self._tasks.start(job_id, lambda: self._run(job_id))

    def resume_all(self) -> None:
        for job in self.store.active():
            logger.info("resuming batch job %s", job.job_id)
            self.start(job.job_id)

    async def cancel(self, job_id: str) -> None:
        """The job ends failed with metadata.cancelled; what was written stays."""
        self.store.set_status(job_id, "failed", cancelled=True)
        await self._tasks.stop(job_id)

    async def shutdown(self) -> None:
        """Stop every job where it is (they resume at the next start)."""
        await self._tasks.shutdown()

    # ------------------------------------------------------------ one job
    async def _run(self, job_id: str) -> None:
        job = self.store.get(job_id)
        if job is None or job.status not in ("validating", "running"):
            return
        try:
            self.store.reconcile(job_id)
            first = _LineHold(await self.hold(job.model, job_keep_alive(job)), self.release)  # loaded on demand
            await self._lines(job, first)
        except asyncio.CancelledError:
            raise
        except MindieError as e:
            logger.warning("batch job %s failed: %s", job_id, e.message)
            self.store.set_status(job_id, "failed", error=e.message)
            return
        except Exception:  # noqa: BLE001 - a broken job must not take the server down
            logger.exception("batch job %s failed", job_id)
            self.store.set_status(job_id, "failed", error="internal error (see the server log)")
            return
        if self.store.get(job_id).status == "running":  # type: ignore[union-attr]
            self.store.set_status(job_id, "completed")
            logger.info("batch job %s completed", job_id)

    async def _lines(self, job: JobRow, first: _LineHold) -> None:
        """The job running: each line not yet done, under a hold of its own (``first``: the hold the job's start
        took, the first pending line's)."""
        spare: _LineHold | None = first
        try:
            self.store.set_status(job.job_id, "running")
            data = await self.frontend.run_blocking(self.store.input_file(job.job_id).read_bytes)
            done = self.store.done(job.job_id)
            params = job_params(job)
            async with SlotTasks(self._slots) as tasks:
                for line, raw in enumerate(split_lines(data)):
                    todo = [g for g in range(job.num_generations)
                            if ("success", line, g) not in done and ("error", line, g) not in done]
                    if ("error", line, BAD_LINE) in done or not todo:
                        continue
                    held, spare = spare or _LineHold(await self.hold(job.model, job_keep_alive(job)),
                                                     self.release), None
                    try:
                        await self._line(job, held, tasks, params, line, raw, todo)
                    finally:
                        held.drop()
        finally:
            if spare is not None:
                spare.drop()

    async def _line(self, job: JobRow, held: _LineHold, tasks: SlotTasks, params: SamplingParams, line: int,
                    raw: bytes, todo: list[int]) -> None:
        engine = held.held.engine
        try:
            req = await self.frontend.engine_request(engine, parse_line(raw),
                                                     dataclasses.replace(params, adapter_id=held.held.adapter_id),
                                                     f"{job.job_id}-{line}")
        except ValidationError as e:  # includes refused media: the line fails, the job goes on
            self.store.commit(job.job_id, "error", line, BAD_LINE, {"line": line, "error": e.message},
                              failed_line=True)
            return
        for g in todo:
            held.add(await tasks.spawn(self._generation, job, engine, req, line, g))

    async def _generation(self, job: JobRow, engine: EngineClient, req: EngineRequest, line: int, gen: int) -> None:
        self.running_generations += 1
        try:
            rid = f"{job.job_id}-{line}-{gen}"
            ereq = dataclasses.replace(req, request_id=rid, priority=PRIORITY_BATCH)
            try:
                result = await fold(engine.generate(ereq))
            except MindieError as e:
                self.store.commit(job.job_id, "error", line, gen, {"line": line, "generation": gen, "error": e.message})
                return
            prompt_n, n = len(req.prompt_token_ids), len(result.tokens)
            record: dict[str, Any] = {
                "line": line, "generation": gen, "text": result.text,
                "finish_reason": "length" if result.finish_reason == FINISH_LENGTH else "stop",
                "usage": {"prompt_tokens": prompt_n, "completion_tokens": n, "total_tokens": prompt_n + n}}
            if job.options.get("logprobs"):
                record["logprobs"] = [max(t.logprob, -9999.0) if t.logprob is not None else None for t in result.tokens]
            self.store.commit(job.job_id, "success", line, gen, record, tokens=n)
        finally:
            self.running_generations -= 1
