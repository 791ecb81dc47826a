"""jobs.store: records committed once, result files kept in step with SQLite through crashes."""
from __future__ import annotations

import json
from pathlib import Path

from mindie_service.jobs.store import JobStore


def _store(tmp_path: Path) -> tuple[JobStore, str]:
    store = JobStore(tmp_path / "jobs")
    job = store.create("m", {"value": "x", "type": "raw_bytes"}, {"max_tokens": 4}, 2, b"[]\n[]\n", 2)
    return store, job


def _lines(store: JobStore, job: str, kind: str) -> list[dict]:
    return [json.loads(x) for x in store.result_file(job, kind).read_text().splitlines()]


def test_a_record_is_committed_once_and_appended_once(tmp_path: Path) -> None:
    store, job = _store(tmp_path)
    assert store.commit(job, "success", 0, 0, {"line": 0, "generation": 0, "text": "a"}, tokens=3)
    assert not store.commit(job, "success", 0, 0, {"line": 0, "generation": 0, "text": "again"}, tokens=3)
    assert _lines(store, job, "success") == [{"line": 0, "generation": 0, "text": "a"}]
    row = store.get(job)
    assert row.generations_written == 1 and row.tokens == 3 and row.status == "validating"
    assert store.done(job) == {("success", 0, 0)}
    assert store.lines_done(job, 2) == 0
    store.commit(job, "error", 1, -1, {"line": 1, "error": "bad"}, failed_line=True)
    assert store.lines_done(job, 2) == 1 and store.get(job).lines_failed == 1


def test_reconcile_restores_a_record_lost_between_commit_and_append(tmp_path: Path) -> None:
    store, job = _store(tmp_path)
    for g in range(2):
        store.commit(job, "success", 0, g, {"line": 0, "generation": g, "text": "é" * 3})
    path = store.result_file(job, "success")
    full = path.read_bytes()
    path.write_bytes(full[: len(full) - 7])  # killed in the middle of the second append
    store.reconcile(job)
    assert path.read_bytes() == full
    path.write_bytes(full[: len(full) // 2 - 1])  # and with the first record cut too
    store.reconcile(job)
    assert path.read_bytes() == full


def test_reconcile_cuts_bytes_beyond_the_committed_records(tmp_path: Path) -> None:
    store, job = _store(tmp_path)
    store.commit(job, "success", 0, 0, {"line": 0, "generation": 0, "text": "a"})
    path = store.result_file(job, "success")
    good = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"line": 9, "gener')  # a torn write that was never committed
    store.reconcile(job)
    assert path.read_bytes() == good
    assert b"".join(store.read_results(job, "success")) == good


def test_jobs_survive_reopening_the_store_and_list_newest_first(tmp_path: Path) -> None:
    store, first = _store(tmp_path)
    second = store.create("m", {"value": "y", "type": "raw_bytes"}, {}, 1, b"[]\n", 1)
    store.set_status(first, "running")
    store.close()
    again = JobStore(tmp_path / "jobs")
    jobs, total = again.list(10, 0)
    assert total == 2 and [j.job_id for j in jobs] == [second, first]
    assert [j.job_id for j in again.active()] == [first, second]
    assert again.get(first).status == "running"
    assert again.get(first).created_rfc3339.endswith("Z")


def test_a_job_cancelled_before_its_generations_start_gives_back_every_slot(tmp_path: Path) -> None:
    """Cancelling the job cancels its generation tasks; one cancelled before it first ran never enters its body,
    so the slot it holds must be given back from outside it (batchMaxRunning would shrink for good)."""
    import asyncio

    from mindie_service.jobs.runner import JobRunner

    class Frontend:
        async def run_blocking(self, fn, *args):
            return fn(*args)

        async def engine_request(self, engine, prompt, params, rid):
            from mindie_service.engine.contract import EngineRequest
            return EngineRequest(rid, (1, 2), params)

    class Engine:
        async def generate(self, req):
            await asyncio.sleep(3600)
            yield None

    store = JobStore(tmp_path / "jobs")
    line = b'[{"role": "user", "text": "hi"}]\n'
    job = store.create("m", {"value": "x", "type": "raw_bytes"}, {"max_tokens": 4, "temperature": 0.0, "top_p": 1.0},
                       1, line * 3, 3)

    class Held:
        engine, adapter_id = Engine(), None

    holds: list[int] = []

    async def go() -> int:
        async def hold(model: str, keep_alive: float | None):
            holds.append(1)
            return Held()

        runner = JobRunner(store, hold, lambda _t: holds.append(-1), Frontend(), max_running=4)  # type: ignore[arg-type]
        runner.start(job)
        await asyncio.sleep(0)  # the job ran up to its wait: its three generation tasks are made, none started
        assert runner.slots._value == 1
        await runner.cancel(job)
        await asyncio.sleep(0)
        return runner.slots._value

    assert asyncio.run(go()) == 4
    assert holds.count(1) == 3 and sum(holds) == 0  # a hold on the model per line, each given back


def test_a_job_started_twice_runs_once() -> None:
    """A resume beside a submit (or two resumes) starts the job's task once; once it ended, a start runs it again."""
    import asyncio

    from mindie_service.jobs.tasks import TaskTable

    runs: list[str] = []

    async def go() -> None:
        table = TaskTable("batch")

        async def job() -> None:
            runs.append("ran")
            await asyncio.sleep(0.01)

        table.start("j", job)
        table.start("j", job)
        await asyncio.sleep(0.05)
        assert runs == ["ran"]
        table.start("j", job)  # the first one ended: the table forgot it
        await asyncio.sleep(0.05)
        await table.shutdown()

    asyncio.run(go())
    assert runs == ["ran", "ran"]
