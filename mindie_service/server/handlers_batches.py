"""OpenAI Batches on the business port (jobs.batch_runner on the jobs' store), errors in OpenAI's shape:

    POST /v1/batches              {input_file_id, endpoint, completion_window, metadata?}: status validating
    GET  /v1/batches              ?after=&limit= newest first, OpenAI's list page
    GET  /v1/batches/{id}
    POST /v1/batches/{id}/cancel  cancelling, then cancelled with what was written

A batch belongs to the API key that made it, and takes only that key's input file."""
from __future__ import annotations

import logging
import re
from typing import Any

from mindie_service.errors import (BadRequestError, ConflictError, NotFoundError, PayloadTooLargeError,
                                   UnhealthyError, ValidationError, check)
from mindie_service.jobs.batch_lines import count_lines
from mindie_service.jobs.batch_runner import BatchRunner
from mindie_service.jobs.batch_store import BatchRow, batch_json
from mindie_service.server.handlers_files import OpenAIStoreHandler

logger = logging.getLogger(__name__)

FIELDS = ("input_file_id", "endpoint", "completion_window", "metadata")
_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smh])$")
_UNIT = {"s": 1, "m": 60, "h": 3600}
METADATA_MAX = 16  # OpenAI's: 16 pairs, keys up to 64 characters, values up to 512


def window_seconds(window: str) -> float:
    m = _WINDOW.match(window)
    assert m is not None  # the config's schema and the check before hold it
    return float(int(m.group(1)) * _UNIT[m.group(2)])


def check_metadata(v: Any) -> dict[str, str] | None:
    if v is None:
        return None
    check(isinstance(v, dict) and len(v) <= METADATA_MAX and all(
        isinstance(k, str) and len(k) <= 64 and isinstance(x, str) and len(x) <= 512 for k, x in v.items()),
        "metadata", f"an object of at most {METADATA_MAX} string pairs (keys up to 64 characters, values up to 512)", v)
    return v


class _BatchesHandler(OpenAIStoreHandler):
    @property
    def runner(self) -> BatchRunner:
        if self.ctx.batches is None:
            raise UnhealthyError("batches are not available until the model is loaded")
        return self.ctx.batches

    def batch(self, bid: str) -> BatchRow:
        b = self.runner.store.batch(bid, self.owner())
        if b is None:
            raise NotFoundError(f"No such Batch object: {bid}")
        return b

    def batch_json(self, b: BatchRow) -> dict[str, Any]:
        return batch_json(b, self.runner.store.counts(b.job_id))


class BatchesHandler(_BatchesHandler):
    """POST /v1/batches (create) and GET /v1/batches (list)."""

    async def post(self) -> None:
        runner, s = self.runner, self.ctx.settings
        body = await self.ctx.run_blocking(self.json_body)
        if "keep_alive" in body:  # a batch holds no model itself: each line does, with its own body's keep_alive
            raise ValidationError("Parameter keep_alive is not taken by a batch: put it in the body of each line of "
                                  "the input file, where it applies to that line's hold of its model")
        unknown = sorted(set(body) - set(FIELDS))
        check(not unknown, "body", f"an object of {', '.join(FIELDS)}", unknown)
        endpoint, window = body.get("endpoint"), body.get("completion_window")
        served = self.ctx.batch_endpoints.urls()
        check(endpoint in served, "endpoint", f"one of {', '.join(served)} (the endpoints this server runs in "
              "batches)", endpoint)
        check(window in s.batch_completion_windows, "completion_window",
              f"one of {', '.join(s.batch_completion_windows)} (ServerConfig.batchCompletionWindows)", window)
        metadata = check_metadata(body.get("metadata"))
        fid = body.get("input_file_id")
        check(isinstance(fid, str) and fid != "", "input_file_id", "a file id", fid)
        owner = self.owner()
        f = self.ctx.files().get(fid, owner)
        if f is None:
            raise NotFoundError(f"Parameter input_file_id: no such File object: {fid}")
        if f.purpose != "batch":
            raise BadRequestError(f"Parameter input_file_id: the file's purpose is {f.purpose}; a batch takes a "
                                  "file uploaded with purpose batch")
        path = self.ctx.files().path(fid)
        total = await self.ctx.run_blocking(count_lines, path)
        check(total > 0, "input_file_id", "a JSONL file with at least one request", "an empty file")
        if total > s.batch_max_lines:
            raise PayloadTooLargeError(f"Parameter input_file_id: a batch holds at most {s.batch_max_lines} requests "
                                       f"(ServerConfig.batchMaxLines), got {total}")
        try:
            b = await self.ctx.run_blocking(runner.store.create_batch, owner, endpoint, fid, window,
                                            window_seconds(window), metadata, path, total)
        except FileNotFoundError:  # deleted meanwhile
            raise NotFoundError(f"Parameter input_file_id: no such File object: {fid}") from None
        logger.info("batch %s created: %d requests to %s", b.id, total, endpoint)
        self.write_json(self.batch_json(b))
        runner.start(b.id)

    def get(self) -> None:
        rows, more = self.runner.store.batches(self.owner(), self.get_query_argument("after", None),
                                               self.int_arg("limit", 20, 1, 100))
        self.write_json({"object": "list", "data": [self.batch_json(b) for b in rows],
                         "first_id": rows[0].id if rows else None, "last_id": rows[-1].id if rows else None,
                         "has_more": more})


class BatchHandler(_BatchesHandler):
    """GET /v1/batches/{id}."""

    def get(self, bid: str) -> None:
        self.write_json(self.batch_json(self.batch(bid)))


class BatchCancelHandler(_BatchesHandler):
    """POST /v1/batches/{id}/cancel."""

    async def post(self, bid: str) -> None:
        b = self.batch(bid)
        if not await self.runner.cancel(b.id):
            raise ConflictError(f"Cannot cancel a batch with status {self.batch(bid).status}")
        self.write_json(self.batch_json(self.batch(bid)))
