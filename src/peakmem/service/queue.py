"""The service's job store and bounded work queue.

A job's id is its content key (:meth:`EstimateJob.key`): submitting the same job again returns
the same record (queued, running or finished), so concurrent duplicates run once and finished
ones are answered from the store. A fixed number of workers take jobs off a bounded queue
(:class:`QueueFull` past it, HTTP 429); each runs the estimator in a thread, in a fresh work
directory. A worker lost mid-job (:class:`WorkerLost`) is retried up to `max_attempts`, then
failed; no job is ever dropped without a final status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from peakmem.service.attempt import run_attempt
from peakmem.service.jobs import (
    EstimateJob,
    Estimator,
    JobFailed,
    WorkerLost,
    error_object,
)
from peakmem.service.metrics import ServiceMetrics
from peakmem.service.store import ResultStore

log = logging.getLogger("peakmem.service")

STATUSES = ("queued", "running", "done", "failed")


REMOTE_POLL_SECONDS = 0.1
"""How often a wait on a job another process runs reads the store."""


class QueueFull(Exception):
    """The queue holds its maximum of waiting jobs."""


@dataclass
class JobRecord:
    id: str
    job: EstimateJob
    status: str = "queued"
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    attempts: int = 0
    retryable: bool = False
    """A failure that was not the job's own (worker lost, service error): a new submission of
    the same job runs it again instead of answering from the store."""
    sandbox: str | None = None
    created: float = field(default_factory=time.time)
    finished: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    remote: bool = False
    """Queued or running in another server process sharing the store (its status is read from
    the store)."""

    @property
    def final(self) -> bool:
        return self.status in ("done", "failed")

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "result": self.result, "error": self.error,
                "attempts": self.attempts, "sandbox": self.sandbox}


@dataclass(frozen=True)
class SandboxChoice:
    """How the service runs jobs: in `backend` ("bwrap", "unshare"), or "none" with `reason`;
    `refuse`: required but unavailable, so every job fails as unsupported."""

    backend: str
    reason: str = ""
    refuse: bool = False

    @property
    def enabled(self) -> bool:
        return self.backend != "none"


def choose_sandbox(mode: str) -> SandboxChoice:
    """`mode`: "required" (jobs fail when no sandbox works here), "auto" (use one when it works,
    else run without and say so), "off"."""
    if mode == "off":
        return SandboxChoice("none", "the service runs jobs without a sandbox (--sandbox off)")
    from peakmem.jobs.sandbox import Sandbox, SandboxUnavailable

    found = Sandbox.probe()
    if isinstance(found, SandboxUnavailable):
        if mode == "required":
            return SandboxChoice("none", found.reason, refuse=True)
        return SandboxChoice("none", f"no sandbox is available here ({found.reason})")
    return SandboxChoice(found.backend)


class JobQueue:
    def __init__(
        self,
        estimator: Estimator,
        *,
        workers: int = 2,
        max_queue: int = 64,
        max_attempts: int = 2,
        max_seconds: float | None = 600.0,
        max_host_memory: int | None = None,
        max_records: int = 10000,
        sandbox: SandboxChoice | None = None,
        metrics: ServiceMetrics | None = None,
        workdir_base: str | None = None,
        job_nice: int = 0,
        store: ResultStore | None = None,
    ) -> None:
        self.estimator = estimator
        self.workers = max(1, workers)
        self.max_queue = max(1, max_queue)
        self.max_attempts = max(1, max_attempts)
        self.max_seconds = max_seconds
        self.max_host_memory = max_host_memory
        self.max_records = max_records
        self.sandbox = sandbox or SandboxChoice("none", "no sandbox was configured")
        self.metrics = metrics or ServiceMetrics()
        self.workdir_base = workdir_base
        self.job_nice = job_nice
        self.store = store
        self.records: OrderedDict[str, JobRecord] = OrderedDict()
        self._queue: asyncio.Queue[JobRecord] | None = None
        self._tasks: list[asyncio.Task] = []
        self._pool: ThreadPoolExecutor | None = None
        self.running = 0

    async def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.max_queue)
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="peakmem-worker")
        self._tasks = [asyncio.create_task(self._work()) for _ in range(self.workers)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def depth(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    def get(self, job_id: str) -> JobRecord | None:
        """The record of `job_id`: this process's, else the store's (a final record, or a job
        another process holds); a job held by another process is read from the store again."""
        record = self.records.get(job_id)
        if self.store is None:
            return record
        if record is None:
            probe = JobRecord(id=job_id, job=EstimateJob(()), remote=True)
            return self._remember(probe) if self._sync(probe) is not None else None
        stale = record.remote or (record.status == "failed" and record.retryable)
        if stale and self._sync(record) is None and record.remote:
            return self._lost(record)
        return record

    def lookup(self, key: str) -> JobRecord | None:
        """The record a new submission of the job with content key `key` is answered with
        (counted as a cached or joined request), or None where it must be queued (unknown, or a
        retryable failure)."""
        record = self.get(key)
        if record is None or (record.status == "failed" and record.retryable):
            return None
        self.records.move_to_end(key)
        self.metrics.requests.labels("cached" if record.final else "joined").inc()
        return record

    def submit(self, job: EstimateJob) -> tuple[JobRecord, bool]:
        """The record for `job` and whether it was newly queued. QueueFull when it must be queued
        and the queue is full."""
        assert self._queue is not None, "JobQueue.start() was not awaited"
        key = job.key()
        record = self.lookup(key)
        if record is not None:
            return record, False
        if self.store is not None:
            if not self.store.claim(key):  # another process took it just now
                record = self._remember(JobRecord(id=key, job=EstimateJob(()), remote=True))
                self.metrics.requests.labels("joined").inc()
                return self.get(key) or record, False
            saved = self.store.load(key)  # it finished, and its claim went, since the lookup
            if saved is not None and not saved["retryable"]:
                self.store.release(key)
                record = self._remember(self._apply(
                    JobRecord(id=key, job=EstimateJob(())), saved))
                self.metrics.requests.labels("cached").inc()
                return record, False
        fresh = JobRecord(id=key, job=job)
        try:
            self._queue.put_nowait(fresh)
        except asyncio.QueueFull:
            if self.store is not None:
                self.store.release(key)
            self.metrics.requests.labels("rejected").inc()
            raise QueueFull(f"the queue is full ({self.max_queue} jobs waiting)") from None
        self.records[key] = fresh
        self.records.move_to_end(key)
        self._evict()
        self.metrics.requests.labels("queued").inc()
        self.metrics.queued.set(self.depth)
        return fresh, True

    async def wait(self, record: JobRecord, timeout: float | None) -> bool:
        """Wait until `record` is final, at most `timeout` seconds; whether it is."""
        if record.final:
            return True
        if record.remote:  # another process runs it: poll the store
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            while not (self.get(record.id) or record).final:
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    return False
                await asyncio.sleep(REMOTE_POLL_SECONDS if left is None
                                    else min(REMOTE_POLL_SECONDS, left))
            return True
        try:
            await asyncio.wait_for(asyncio.shield(record.done.wait()), timeout)
        except TimeoutError:
            return False
        return True

    def _remember(self, record: JobRecord) -> JobRecord:
        self.records[record.id] = record
        self.records.move_to_end(record.id)
        self._evict()
        return record

    def _sync(self, record: JobRecord) -> JobRecord | None:
        """`record` brought up to date from the store (a final record; a job another live
        process holds; failed, retryable, where that process is gone), or None where the store
        knows nothing of it."""
        assert self.store is not None
        saved = self.store.load(record.id)
        if saved is not None and not saved["retryable"]:
            return self._apply(record, saved)
        claim = self.store.read_claim(record.id)
        if claim is not None and not self.store.mine(claim) and self.store.live(claim):
            record.status = claim.status if claim.status in ("queued", "running") else "queued"
            record.result = record.error = None
            record.retryable, record.remote = False, True
            return record
        saved = self.store.load(record.id) or saved  # it may have finished between the reads
        if saved is not None:
            return self._apply(record, saved)
        if claim is not None and not self.store.mine(claim):  # its process is gone: never lost
            return self._lost(record)
        return None

    def _lost(self, record: JobRecord) -> JobRecord:
        """`record` failed, retryable: the process that held it is gone without a final record."""
        record.status, record.retryable, record.remote = "failed", True, False
        record.error = error_object(
            "job_failed", "the server process that held this job stopped before it finished; "
            "send it again to run it", 1, "exit")
        record.finished = time.time()
        record.done.set()
        return record

    def _apply(self, record: JobRecord, saved: dict[str, Any]) -> JobRecord:
        """`record` made the final record the store saved."""
        view = saved["view"]
        record.status, record.result, record.error = view["status"], view.get("result"), view.get(
            "error")
        record.attempts, record.sandbox = int(view.get("attempts") or 0), view.get("sandbox")
        record.retryable, record.remote = saved["retryable"], False
        record.finished = record.finished or time.time()
        record.done.set()
        return record

    def _publish(self, record: JobRecord) -> None:
        """A final record into the store for the other processes, and the claim let go."""
        if self.store is None:
            return
        try:
            self.store.save(record.id, record.view(), record.retryable)
        except OSError as exc:
            log.error("peakmem service: cannot save job %s to the store: %s", record.id, exc)
        self.store.release(record.id)

    def _evict(self) -> None:
        while len(self.records) > self.max_records:
            for key, record in self.records.items():
                if record.final:
                    del self.records[key]
                    break
            else:
                return

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            record = await self._queue.get()
            self.metrics.queued.set(self.depth)
            try:
                await self._run(record)
            except Exception as exc:  # noqa: BLE001 - a bug here must not lose the job
                log.exception("peakmem service: job %s failed in the worker", record.id)
                self._fail(record, error_object(
                    "internal", f"peakmem internal error: {type(exc).__name__}: {exc}", 70,
                    "internal"), retryable=True)
            finally:
                self._queue.task_done()

    async def _run(self, record: JobRecord) -> None:
        record.status = "running"
        record.sandbox = self.sandbox.backend
        if self.store is not None:
            self.store.mark(record.id, "running")
        self.running += 1
        self.metrics.running.set(self.running)
        started = time.monotonic()
        try:
            if self.sandbox.refuse:
                self._fail(record, error_object(
                    "unsupported", f"peakmem: --sandbox is not available here: "
                    f"{self.sandbox.reason}", 3, "sandbox_unavailable"))
                return
            loop = asyncio.get_running_loop()
            while True:
                record.attempts += 1
                try:
                    result = await loop.run_in_executor(self._pool, self._attempt, record.job)
                except JobFailed as exc:
                    self._fail(record, exc.error)
                    return
                except WorkerLost as exc:
                    log.warning("peakmem service: job %s attempt %d: %s", record.id,
                                record.attempts, exc)
                    if record.attempts < self.max_attempts:
                        self.metrics.retries.inc()
                        continue
                    error = dict(exc.error)
                    error["message"] = f"{error['message']} (tried {record.attempts} times)"
                    self._fail(record, error, retryable=True)
                    return
                break
            if not isinstance(result, dict):
                raise TypeError(f"the estimator returned {type(result).__name__}, not a dict")
            if not self.sandbox.enabled:
                result = dict(result)
                result["notes"] = [*result.get("notes", []),
                                   f"the service ran this job without a sandbox: {self.sandbox.reason}"]
            record.result = result
            record.status = "done"
            record.finished = time.time()
            record.job = replace(record.job, files={})  # the store keeps results, not inputs
            self.metrics.jobs.labels("done").inc()
            self._publish(record)
            record.done.set()
        finally:
            self.running -= 1
            self.metrics.running.set(self.running)
            self.metrics.seconds.observe(time.monotonic() - started)

    def _fail(self, record: JobRecord, error: dict[str, Any], retryable: bool = False) -> None:
        record.error = error
        record.retryable = retryable
        record.status = "failed"
        record.finished = time.time()
        record.job = replace(record.job, files={})
        self.metrics.jobs.labels("failed").inc()
        self._publish(record)
        record.done.set()

    def _attempt(self, job: EstimateJob) -> dict[str, Any]:
        """One run of the estimator in a fresh work directory (a worker thread)."""
        return run_attempt(job, self.estimator, sandbox=self.sandbox.enabled,
                           max_seconds=self.max_seconds, max_host_memory=self.max_host_memory,
                           workdir_base=self.workdir_base, nice=self.job_nice)
