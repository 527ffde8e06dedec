"""Jobs and their listeners (macapp/core/engine/jobs.py), on the real worker thread."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from macapp.core import events as ev
from macapp.core.engine import EngineError, Job
from macapp.core.events import AnswerDelta, Failed, Finished, PromptProgress, Reply, Unloaded
from macapp.core.sampling import greedy
from tests.core.engine.helpers import TIMEOUT


def test_listeners_run_on_the_worker_and_late_listeners_get_a_replay(engine):
    threads = set()
    job = engine.new_session().send("hi", thinking=False, sampling=greedy(30))
    job.add_listener(lambda e: threads.add(threading.current_thread().name))
    job.wait(TIMEOUT)
    late = []
    job.add_listener(late.append)
    assert "qwen-desk-engine" in threads
    assert late == job.history and isinstance(late[-1], Finished)


def test_listeners_added_while_streaming_get_every_event_once_in_order(engine, off_script):
    job = engine.new_session().send("go", thinking=False, sampling=off_script.with_overrides(max_tokens=200))
    started = threading.Event()
    job.add_listener(lambda e: started.set() if isinstance(e, AnswerDelta) else None)
    assert started.wait(TIMEOUT)
    me = threading.current_thread()

    def slow_here(got):  # the replay on this thread is slow, so the worker emits new events meanwhile
        return lambda e: (time.sleep(0.002) if threading.current_thread() is me else None, got.append(e))

    received, while_running = [], 0
    for _ in range(6):
        received.append([])
        while_running += not job.done
        job.add_listener(slow_here(received[-1]))
    job.join(TIMEOUT)
    full = job.history
    assert while_running >= 2
    for got in received:
        assert got == full and sum(isinstance(e, Finished) for e in got) == 1


def test_a_listener_that_raises_is_logged_and_keeps_getting_events(caplog):
    job = Job("test")
    got, others = [], []

    def broken(event):
        got.append(event)
        raise RuntimeError("listener bug")

    job.add_listener(broken)
    job.add_listener(others.append)
    with caplog.at_level(logging.ERROR, logger="macapp.core.event_stream"):
        job.emit(AnswerDelta("a"))
        job.emit(Finished(Reply(text="a")))
    assert len(got) == 2 and others == got == job.history
    failures = [r for r in caplog.records if "listener" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info and "listener bug" in str(r.exc_info[1]) for r in failures)


@pytest.mark.parametrize("terminal", [Finished(Reply(text="x")), Failed("bad", ev.NOT_FOUND), Unloaded(0)])
def test_every_terminal_event_ends_the_job_and_nothing_comes_after(terminal):
    job = Job("test")
    job.emit(PromptProgress(0, 3))
    job.emit(terminal)
    job.emit(AnswerDelta("too late"))
    assert job.done and job.history == [PromptProgress(0, 3), terminal] and list(job.events()) == job.history
    assert job.wait(0) is terminal
    if isinstance(terminal, Failed):
        with pytest.raises(EngineError) as err:
            job.result(0)
        assert (err.value.code, err.value.message) == (ev.NOT_FOUND, "bad")
    else:
        assert job.result(0) == (terminal.reply if isinstance(terminal, Finished) else terminal)


def test_an_idle_job_times_out_its_readers():
    job = Job("test")
    job.emit(PromptProgress(0, 1))
    events = job.events(timeout=0.05)
    assert next(events) == PromptProgress(0, 1)
    with pytest.raises(TimeoutError):
        next(events)
    with pytest.raises(TimeoutError):
        job.wait(0.05)


def test_an_armed_early_reply_is_sent_by_stop_from_another_thread():
    job = Job("test")
    threads = []
    job.add_listener(lambda e: threads.append(threading.current_thread().name))
    early = Finished(Reply(finish_reason="stopped", kept=False))
    assert job.arm_early_reply(early) is False
    assert not job.stop_event.is_set()
    job.stop()
    assert job.stop_event.is_set() and job.stopped and job.stop_requested_at is not None
    assert job.wait(TIMEOUT) is early and threads == ["qwen-desk-stop"]
    assert job.disarm_early_reply() is True  # the worker learns the reply was already sent
    job.emit(Finished(Reply(text="the worker's own, ignored")))
    assert job.history == [early]


def test_without_an_armed_reply_stop_only_asks():
    job = Job("test")
    job.arm_early_reply(Finished(Reply()))
    assert job.disarm_early_reply() is False
    job.stop()
    time.sleep(0.05)
    assert not job.done and job.stopped


def test_join_waits_for_the_worker_to_settle_the_job():
    job = Job("test")
    job.emit(Finished(Reply()))
    with pytest.raises(TimeoutError):
        job.join(0.05)
    job.settle()
    job.join(0)
