"""Jobs and their listeners (macapp/core/engine/jobs.py), on the real worker thread."""

from __future__ import annotations

import threading
import time

from macapp.core.events import AnswerDelta, Finished
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
