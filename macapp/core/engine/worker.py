"""The process's one MLX thread: it runs every job's work, in submission order, and never ends."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

from macapp.core import events as ev
from macapp.core.engine.errors import EngineError
from macapp.core.engine.jobs import Job
from macapp.core.events import Failed

log = logging.getLogger(__name__)

THREAD_NAME = "qwen-desk-engine"


class _Worker:
    """It never ends: with mlx 0.32 (CPU) a process whose MLX-using thread has exited can abort at interpreter
    exit ("terminate called without an active exception"), so closed engines leave it parked on its queue."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[Job, Callable[[Job], None]]] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job, work = self.queue.get()
            run_job(job, work)


def run_job(job: Job, work: Callable[[Job], None]) -> None:
    """Run `work(job)`; whatever happens the job ends with exactly one terminal event, then is settled."""
    try:
        work(job)
    except EngineError as exc:
        job.emit(Failed(exc.message, exc.code))
    except Exception as exc:  # keep the worker alive whatever happens; the trace goes to the log
        log.exception("%s job %d failed", job.kind, job.id)
        job.emit(Failed(f"Unexpected engine error: {type(exc).__name__}: {exc}", ev.ERROR))
    if not job.done:  # every job ends with a terminal event
        job.emit(Failed("The engine ended this job without a result.", ev.ERROR))
    job.settle()


_worker: _Worker | None = None
_worker_lock = threading.Lock()


def start_worker() -> None:
    """Start the worker thread now (it imports nothing). The window calls this before Qt builds any widget: on Linux
    a worker started after the library or Local Server page was built ran MLX about 40% slower (bench/ui_bench.py,
    RESULTS.md; the cause is not identified)."""
    _get_worker()


def _get_worker() -> _Worker:
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = _Worker()
        return _worker


def waiting_jobs() -> int:
    """How many jobs wait for the worker (not counting the one it runs): the batch hands over when any do."""
    worker = _worker
    return worker.queue.qsize() if worker is not None else 0


def submit_work(job: Job, work: Callable[[Job], None]) -> None:
    """Queue `work(job)` on the worker thread (started on first use)."""
    _get_worker().queue.put((job, work))
