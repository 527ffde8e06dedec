"""The one MLX thread (macapp/core/engine/worker.py): every job ends with one terminal event and is settled."""

from __future__ import annotations

import logging
import threading

from macapp.core import events as ev
from macapp.core.engine import EngineError, Job
from macapp.core.engine.worker import THREAD_NAME, run_job
from macapp.core.events import Failed, Finished, Reply
from tests.core.engine.helpers import TIMEOUT


def _run(work):
    job = Job("test")
    run_job(job, work)
    job.join(0)  # settled
    return job


def test_a_refusal_becomes_failed_with_its_code():
    def work(job):
        raise EngineError("No such folder.", ev.NOT_FOUND)

    job = _run(work)
    assert job.history == [Failed("No such folder.", ev.NOT_FOUND)]


def test_an_unexpected_error_is_failed_and_logged_with_its_trace(caplog):
    def work(job):
        raise ZeroDivisionError("oops")

    with caplog.at_level(logging.ERROR, logger="macapp.core.engine.worker"):
        job = _run(work)
    (last,) = job.history
    assert isinstance(last, Failed) and last.code == ev.ERROR and "ZeroDivisionError: oops" in last.message
    assert any(r.exc_info and isinstance(r.exc_info[1], ZeroDivisionError) for r in caplog.records)


def test_work_that_reports_nothing_still_ends_its_job():
    job = _run(lambda job: None)
    assert isinstance(job.history[-1], Failed) and "without a result" in job.history[-1].message
    done = _run(lambda job: job.emit(Finished(Reply(text="ok"))))
    assert done.history == [Finished(Reply(text="ok"))]


def test_engine_work_runs_on_the_one_worker_thread_in_order(engine):
    order, threads = [], set()

    def work(n):
        def run(job):
            order.append(n)
            threads.add(threading.current_thread().name)
            job.emit(Finished(Reply()))

        return run

    jobs = [engine.submit("test", work(n)) for n in range(5)]
    for job in jobs:
        job.join(TIMEOUT)
    assert order == list(range(5)) and threads == {THREAD_NAME}
