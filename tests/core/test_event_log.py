"""The event log under a Job and a conversation's Turn: order, the terminal event last, waits that time out."""

import threading
import time

import pytest

from macapp.core.event_log import EventLog
from macapp.core.events import AnswerDelta, Failed, PromptProgress


def test_events_in_order_and_nothing_after_the_terminal_one():
    log = EventLog("the engine")
    assert log.add(PromptProgress(1, 2)) and log.add(AnswerDelta("a"))
    assert log.add(Failed("boom", "x"))
    assert not log.add(AnswerDelta("late"))
    assert log.done
    assert list(log.events()) == [PromptProgress(1, 2), AnswerDelta("a"), Failed("boom", "x")]
    assert log.wait(0) == Failed("boom", "x")


def test_a_blocked_reader_gets_every_event_appended_from_another_thread():
    log = EventLog("the engine", wake_every=0.02)
    pieces = [AnswerDelta(str(i)) for i in range(200)]

    def produce() -> None:
        for piece in pieces:
            log.add(piece)
        time.sleep(0.05)  # the last text pieces may not wake the reader: it must find them by polling
        log.add(Failed("end", "x"))

    threading.Thread(target=produce).start()
    got = list(log.events(timeout=60))
    assert got == [*pieces, Failed("end", "x")]


def test_waits_time_out_naming_what_they_wait_for():
    log = EventLog("the turn")
    log.add(AnswerDelta("a"))
    with pytest.raises(TimeoutError, match="the turn did not finish"):
        log.wait(0.05)
    reader = log.events(timeout=0.05)
    assert next(reader) == AnswerDelta("a")
    with pytest.raises(TimeoutError, match="no event from the turn"):
        next(reader)
