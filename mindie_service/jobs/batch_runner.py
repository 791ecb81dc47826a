"""Runs OpenAI batches on the IO loop, on the jobs' store (each line's record committed once, jobs.store) and
their slots (at most ServerConfig.batchMaxRunning lines of all batches and jobs in the engine at once, each at
batch priority, below online traffic).

A batch is validated (bad lines answered in the error file, duplicate custom_ids fail it), then each line is
answered by its endpoint's function (jobs.batch_lines.BatchEndpoints: the online route's own code) until none is
left or the completion window passes (what is left is answered ``batch_expired``). Then its output and error
files become Files (purpose ``batch_output``) and it ends completed, expired or cancelled. Every step can be cut
by ``kill -9``: a restart picks the batch up at the status it reached and the lines not yet recorded."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Awaitable, Callable

from mindie_service.jobs.batch_lines import BatchEndpoints, BatchLine, LineCall, LineReply, validate_lines
from mindie_service.jobs.batch_store import BatchRow, BatchStore
from mindie_service.jobs.lines import split_lines
from mindie_service.jobs.tasks import SlotTasks, TaskTable
from mindie_service.storage.files_store import FilesStore

logger = logging.getLogger(__name__)

RunBlocking = Callable[..., Awaitable[Any]]
EXPIRED = {"code": "batch_expired", "message": "This request could not be executed before the completion window "
           "expired."}
ENDED = {"finalizing": "completed", "cancelling": "cancelled", "in_progress": "expired"}


def _record(custom_id: str | None, response: dict[str, Any] | None, error: dict[str, Any] | None) -> dict[str, Any]:
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id, "response": response, "error": error}


def _internal(rid: str) -> LineReply:
    return LineReply(500, {"error": {"message": f"Request {rid} failed in the server (see its log)",
                                     "type": "server_error", "param": None, "code": "internal_error"}})


class BatchRunner:
    def __init__(self, store: BatchStore, files: FilesStore, endpoints: BatchEndpoints, slots: asyncio.Semaphore,
                 run_blocking: RunBlocking) -> None:
        self.store, self.files, self.endpoints, self.slots = store, files, endpoints, slots
        self.run_blocking = run_blocking
        self._tasks = TaskTable("openai")

    # ------------------------------------------------------------ lifecycle
    def start(self, bid: str) -> None:
        self._tasks.start(bid, lambda: self._run(bid))

    def resume_all(self) -> None:
        for b in self.store.unfinished():
            logger.info("resuming batch %s (%s)", b.id, b.status)
            self.start(b.id)

    async def cancel(self, bid: str) -> bool:
        """The batch stops taking lines and ends cancelled with what was recorded; False when it had ended."""
        if not self.store.set_batch(bid, "cancelling", only_from=("validating", "in_progress")):
            return False
        await self._tasks.stop(bid)
        self.start(bid)  # finalizes what was written, then cancelled
        return True

    async def shutdown(self) -> None:
        """Stop every batch where it is (it resumes at the next start)."""
        await self._tasks.shutdown()

    # ------------------------------------------------------------ one batch
    async def _run(self, bid: str) -> None:
        try:
            b = self.store.batch(bid)
            if b is None:
                return
            await self.run_blocking(self.store.reconcile, b.job_id)
            raw = split_lines(await self.run_blocking(self.store.input_file(b.job_id).read_bytes))
            good, bad, fatal = validate_lines(raw, b.endpoint)
            if b.status == "validating":
                b = self._validated(b, bad, fatal)
            if b.status == "in_progress":
                await self._in_progress(b, good)
            b = self.store.batch(bid)  # type: ignore[assignment]
            if b.status in ENDED:
                await self._finalize(b, ENDED[b.status])
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a broken batch must not take the server down
            logger.exception("batch %s failed", bid)
            self.store.set_batch(bid, "failed", errors=[{"code": "server_error", "line": None, "param": None,
                                                        "message": "internal error (see the server log)"}])

    def _validated(self, b: BatchRow, bad: list[Any], fatal: list[dict[str, Any]]) -> BatchRow:
        if fatal:
            logger.info("batch %s failed validation: %d errors", b.id, len(fatal))
            self.store.set_batch(b.id, "failed", only_from=("validating",), errors=fatal)
        else:
            for e in bad:
                self.store.commit(b.job_id, "error", e.line, 0, _record(e.custom_id, None, e.error()))
            self.store.set_batch(b.id, "in_progress", only_from=("validating",))
        return self.store.batch(b.id)  # type: ignore[return-value]

    async def _in_progress(self, b: BatchRow, good: list[BatchLine]) -> None:
        left = b.expires_at - time.time()
        try:
            await asyncio.wait_for(self._lines(b, good), timeout=max(0.0, left))
        except TimeoutError:
            logger.info("batch %s expired", b.id)
            done = self.store.done(b.job_id)
            for ln in good:
                if ("success", ln.line, 0) not in done and ("error", ln.line, 0) not in done:
                    self.store.commit(b.job_id, "error", ln.line, 0, _record(ln.custom_id, None, EXPIRED))
            return  # still in_progress: _run finalizes it expired (again after a restart, the window having passed)
        self.store.set_batch(b.id, "finalizing", only_from=("in_progress",))

    async def _lines(self, b: BatchRow, good: list[BatchLine]) -> None:
        done = self.store.done(b.job_id)
        fn = self.endpoints.get(b.endpoint)
        async with SlotTasks(self.slots) as tasks:
            for ln in good:
                if ("success", ln.line, 0) not in done and ("error", ln.line, 0) not in done:
                    await tasks.spawn(self._line, b, ln, fn)

    async def _line(self, b: BatchRow, ln: BatchLine, fn: Any) -> None:
        rid = f"{b.id}-{ln.line}"
        if fn is None:  # the endpoint was served when the batch was made, and is not now
            reply = LineReply(404, {"error": {"message": f"{b.endpoint} is not served now", "type":
                                              "invalid_request_error", "param": "url", "code": "not_found"}})
        else:
            try:
                reply = await fn(LineCall(ln.body, rid, b.owner))
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one broken line fails alone
                logger.exception("%s: batch line failed", rid)
                reply = _internal(rid)
        ok = 200 <= reply.status_code < 300
        rec = _record(ln.custom_id, {"status_code": reply.status_code, "request_id": rid, "body": reply.body},
                      None)
        self.store.commit(b.job_id, "success" if ok else "error", ln.line, 0, rec)

    async def _finalize(self, b: BatchRow, final: str) -> None:
        """The output and error files as Files (fixed ids: a restart here makes the same ones), then ``final``."""
        ids: dict[str, str | None] = {}
        for kind, field, name in (("success", "output_file_id", "output"), ("error", "error_file_id", "error")):
            n = self.store.committed_bytes(b.job_id, kind)
            ids[field] = None
            if n:
                row = await self.run_blocking(self.files.copy_in, self.store.result_file(b.job_id, kind), n, b.owner,
                                              "batch_output", f"{b.id}_{name}.jsonl", f"file-{b.id[6:]}-{name}")
                ids[field] = row.id
        self.store.set_batch(b.id, final, **ids)
        logger.info("batch %s %s", b.id, final)
