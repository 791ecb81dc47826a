"""OpenAI Files on the business port (storage.files_store), errors in OpenAI's shape:

    POST   /v1/files                multipart (file, purpose=batch), streamed to disk as it arrives; a file
                                    over ServerConfig.filesStore.maxFileBytes is a 413 (the body read and dropped)
    GET    /v1/files                ?purpose=&after=&limit=&order= OpenAI's list page
    GET    /v1/files/{id}           the File object
    GET    /v1/files/{id}/content   its bytes
    DELETE /v1/files/{id}

A file belongs to the API key that uploaded it (a batch's output files to the batch's key)."""
from __future__ import annotations

import logging
from typing import Any

from mindie_service.errors import MindieError, NotFoundError, PayloadTooLargeError, check
from mindie_service.protocol.openai_encoder import openai_error
from mindie_service.server.files_upload import FILE_FIELD, Upload, boundary_of
from mindie_service.server.handlers_base import BaseHandler
from mindie_service.server.responses_prepare import owner_of
from mindie_service.storage.files_store import UPLOAD_PURPOSES, FileRow, FilesStore

logger = logging.getLogger(__name__)

FORM_SLACK = 64 * 1024  # a form's boundaries, part headers and small fields, beside the file's bytes


class OpenAIStoreHandler(BaseHandler):
    """A route of OpenAI's stored objects (files, batches): errors in OpenAI's shape, objects per owner."""

    def error_json(self, err: MindieError) -> Any:
        status, body = openai_error(err)
        self.set_status(status)
        return body

    def owner(self) -> str:
        return owner_of(self)

    def int_arg(self, name: str, default: int, lo: int, hi: int) -> int:
        raw = self.get_query_argument(name, None)
        if raw is None:
            return default
        check(raw.isdigit() and lo <= int(raw) <= hi, name, f"an integer in [{lo}, {hi}]", raw)
        return int(raw)


class _FilesHandler(OpenAIStoreHandler):
    @property
    def store(self) -> FilesStore:
        return self.ctx.files()

    def file(self, file_id: str) -> FileRow:
        row = self.store.get(file_id, self.owner())
        if row is None:
            raise NotFoundError(f"No such File object: {file_id}")
        return row


class FilesHandler(_FilesHandler):
    """POST /v1/files (upload) and GET /v1/files (list)."""

    def initialize(self, ctx: Any) -> None:
        super().initialize(ctx)
        self._upload: Upload | None = None

    def body_limit(self) -> int:
        return self.ctx.settings.files_max_bytes + FORM_SLACK

    def _too_large_error(self, size: int) -> PayloadTooLargeError:
        return PayloadTooLargeError(f"Parameter file: a file must be at most {self.ctx.settings.files_max_bytes} "
                                    f"bytes (ServerConfig.filesStore.maxFileBytes), got {size} bytes")

    def prepare(self) -> None:
        super().prepare()
        if self.request.method != "POST" or self._refusal is not None or self._finished:
            return
        try:
            boundary = boundary_of(self.request.headers.get("Content-Type"))
        except MindieError as e:
            self.refuse(e)
            return
        self._upload = Upload(boundary, self.store.new_tmp(), self.ctx.settings.files_max_bytes)

    async def data_received(self, chunk: bytes) -> None:  # type: ignore[override]
        if self._upload is None or self._refusal is not None:
            super().data_received(chunk)
            return
        self._size += len(chunk)
        await self.ctx.run_blocking(self._upload.feed, chunk)  # Tornado reads the next chunk once this is done

    def on_connection_close(self) -> None:
        super().on_connection_close()
        if self._upload is not None:
            self._upload.discard()

    async def post(self) -> None:
        up = self._upload
        assert up is not None  # prepare made it (or refused the request)
        try:
            if up.too_large:
                raise self._too_large_error(up.file_bytes)
            await self.ctx.run_blocking(up.finish)
            unknown = sorted(set(up.fields) - {"purpose"})
            check(not unknown, "purpose", "the only field beside file", unknown)
            purpose = up.fields.get("purpose")
            check(purpose in UPLOAD_PURPOSES, "purpose", " or ".join(UPLOAD_PURPOSES), purpose)
            check(up.filename is not None, FILE_FIELD, "a file part", "none")
            owner, cap = self.owner(), self.ctx.settings.files_max_total_bytes
            used = self.store.used(owner)
            if used + up.file_bytes > cap:
                raise PayloadTooLargeError(f"Parameter file: this key keeps {used} bytes of files; {up.file_bytes} "
                                           f"more would pass ServerConfig.filesStore.maxTotalBytes ({cap}): delete "
                                           "files first")
            row = await self.ctx.run_blocking(self.store.add, up.tmp, owner, purpose, up.filename)
        except BaseException:
            up.discard()
            raise
        logger.info("file %s uploaded: %d bytes", row.id, row.bytes)
        self.write_json(row.to_json())

    def get(self) -> None:
        purpose = self.get_query_argument("purpose", None)
        order = self.get_query_argument("order", "desc")
        check(order in ("asc", "desc"), "order", "asc or desc", order)
        rows, more = self.store.list(self.owner(), purpose, self.get_query_argument("after", None),
                                     self.int_arg("limit", 10000, 1, 10000), order)
        self.write_json({"object": "list", "data": [r.to_json() for r in rows],
                         "first_id": rows[0].id if rows else None, "last_id": rows[-1].id if rows else None,
                         "has_more": more})


class FileHandler(_FilesHandler):
    """GET /v1/files/{id} (the File object) and DELETE /v1/files/{id}."""

    def get(self, file_id: str) -> None:
        self.write_json(self.file(file_id).to_json())

    def delete(self, file_id: str) -> None:
        if not self.store.delete(file_id, self.owner()):
            raise NotFoundError(f"No such File object: {file_id}")
        self.write_json({"id": file_id, "object": "file", "deleted": True})


class FileContentHandler(_FilesHandler):
    """GET /v1/files/{id}/content: the file's bytes."""

    async def get(self, file_id: str) -> None:
        row = self.file(file_id)
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Content-Length", str(row.bytes))
        for chunk in self.store.read(row.id):
            self.write(chunk)
            await self.flush()
        self.finish()
