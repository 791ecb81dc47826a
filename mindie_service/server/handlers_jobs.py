"""llama-stack's batch inference routes (business port): submit a JSONL of conversations, poll the job.

    POST /batch_inference/submit_job          {model, prompt_file_path: Path, options, num_generations}
    GET  /batch_inference/job_status?job_id=  the job (BatchInference)
    GET  /batch_inference/jobs?limit=&offset= newest first (beyond the seed)
    POST /batch_inference/cancel_job?job_id=  ends failed, metadata.cancelled: true (beyond the seed)
    GET  /batch_inference/job_results?job_id=&kind=success|error  the JSONL as committed (beyond the seed)
"""
from __future__ import annotations

import logging
from typing import Any

from mindie_service.errors import (ConflictError, MindieError, NotFoundError, PayloadTooLargeError, UnhealthyError,
                                   check)
from mindie_service.jobs.input_file import MAX_INPUT_BYTES, JobInputLimits, read_job_input
from mindie_service.jobs.lines import split_lines
from mindie_service.jobs.runner import JobRunner
from mindie_service.jobs.spec import JobRequest, PathSpec, parse_job_request
from mindie_service.jobs.store import JobRow
from mindie_service.params.structured_field import read_structured
from mindie_service.server.context import ServerContext
from mindie_service.server.handlers_base import BaseHandler

logger = logging.getLogger(__name__)


async def check_model(ctx: ServerContext, model: str) -> None:
    """404 unless ``model`` names a catalog model or a loaded adapter (it need not be running yet: the job's run
    loads it)."""
    if ctx.catalog is None:
        await ctx.engine_for(model)
        return
    try:
        ctx.catalog.get(model)
    except NotFoundError:
        await ctx.engine_for(model, loads=False)  # an adapter name resolves through the running models


def job_json(job: JobRow, store: Any, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    def path(kind: str) -> dict[str, str]:
        return {"value": str(store.result_file(job.job_id, kind)), "type": "filepath"}

    meta = {"model": job.model, "num_generations": job.num_generations, "options": job.options,
            "lines_total": job.lines_total, "lines_done": store.lines_done(job.job_id, job.num_generations),
            "lines_failed": job.lines_failed, "generations_written": job.generations_written, "tokens": job.tokens,
            "cancelled": job.cancelled}
    if job.error:
        meta["error"] = job.error
    meta.update(metadata or {})
    return {"job_id": job.job_id, "created": job.created_rfc3339, "status": job.status,
            "input_file_path": {"value": str(store.input_file(job.job_id)), "type": "filepath"},
            "success_file_path": path("success"), "error_file_path": path("error"), "metadata": meta}


class _JobsHandler(BaseHandler):
    @property
    def runner(self) -> JobRunner:
        if self.ctx.jobs is None:
            raise UnhealthyError("batch jobs are not available until the model is loaded")
        return self.ctx.jobs

    def _job(self) -> JobRow:
        job_id = self.get_query_argument("job_id", None)
        check(bool(job_id), "job_id", "a job id", job_id)
        job = self.runner.store.get(job_id)  # type: ignore[arg-type]
        if job is None:
            raise NotFoundError(f"batch job {job_id!r} not found")
        return job


class SubmitJobHandler(_JobsHandler):
    async def post(self) -> None:
        runner, ctx = self.runner, self.ctx
        spec = parse_job_request(self.json_body(), ctx.engine_config.max_iter_times)
        await check_model(ctx, spec.model)
        await self._check_structured(spec)
        data = await self._read_input(spec.input_path)
        lines = split_lines(data)
        limit = ctx.settings.batch_max_lines
        if len(lines) > limit:
            raise PayloadTooLargeError(f"Parameter prompt_file_path must hold at most {limit} lines "
                                       f"(ServerConfig.batchMaxLines), got {len(lines)}")
        check(len(lines) > 0, "prompt_file_path", "a JSONL file with at least one line", "an empty file")
        job_id = runner.store.create(spec.model, spec.input_path.to_json(), spec.options.to_json(),
                                     spec.num_generations, data, len(lines))
        job = runner.store.get(job_id)
        logger.info("batch job %s submitted: %d lines x %d generations", job_id, len(lines), spec.num_generations)
        self.write_json(job_json(job, runner.store))  # type: ignore[arg-type]
        runner.start(job_id)

    async def _check_structured(self, spec: JobRequest) -> None:
        """A bad ``options.response_format`` is refused now, naming the field and llguidance's reason (compiled
        off the IO loop, cached for the lines), instead of failing every line. A catalog model that is not
        running yet has no tokenizer here: its lines' compiles name a bad schema then."""
        structured = read_structured({"response_format": spec.options.response_format}, "job", "options.")
        if structured is None:
            return
        try:
            engine, _ = await self.ctx.engine_for(spec.model, loads=False)  # a submit never loads a model
        except MindieError:
            return
        await self.ctx.run_blocking(self.ctx.frontend.processor(engine).check_structured, structured)

    async def _read_input(self, path: PathSpec) -> bytes:
        limits = JobInputLimits.build(self.ctx.fetch_policy, self.ctx.settings.batch_jobs_dir, MAX_INPUT_BYTES)
        return await read_job_input(path, limits, self.ctx.run_blocking)


class JobStatusHandler(_JobsHandler):
    def get(self) -> None:
        self.write_json(job_json(self._job(), self.runner.store))


class ListJobsHandler(_JobsHandler):
    def get(self) -> None:
        limit = self._int_arg("limit", 20, 1, 1000)
        offset = self._int_arg("offset", 0, 0, 10**9)
        jobs, total = self.runner.store.list(limit, offset)
        self.write_json({"object": "list", "data": [job_json(j, self.runner.store) for j in jobs],
                         "total": total, "limit": limit, "offset": offset})

    def _int_arg(self, name: str, default: int, lo: int, hi: int) -> int:
        raw = self.get_query_argument(name, None)
        if raw is None:
            return default
        check(raw.isdigit() and lo <= int(raw) <= hi, name, f"an integer in [{lo}, {hi}]", raw)
        return int(raw)


class CancelJobHandler(_JobsHandler):
    async def post(self) -> None:
        job = self._job()
        if job.status not in ("validating", "running"):
            raise ConflictError(f"batch job {job.job_id!r} has already ended ({job.status})")
        await self.runner.cancel(job.job_id)
        self.write_json(job_json(self.runner.store.get(job.job_id), self.runner.store))  # type: ignore[arg-type]


class JobResultsHandler(_JobsHandler):
    async def get(self) -> None:
        job = self._job()
        kind = self.get_query_argument("kind", "success")
        check(kind in ("success", "error"), "kind", "success or error", kind)
        self.set_header("Content-Type", "application/jsonl; charset=utf-8")
        for chunk in self.runner.store.read_results(job.job_id, kind):
            self.write(chunk)
            await self.flush()
        self.finish()
