"""The event stream under a Job and a conversation's Turn: order, the terminal event last, listeners served once each
in order on the stream's rules (a raising one logged, the others still served), waits that time out."""

import logging
import threading
import time

import pytest

from macapp.core.event_stream import EventStream
from macapp.core.events import AnswerDelta, Failed, PromptProgress


def test_events_in_order_and_nothing_after_the_terminal_one():
    stream = EventStream("the engine")
    got = []
    stream.add_listener(got.append)
    stream.emit(PromptProgress(1, 2))
    stream.emit(AnswerDelta("a"))
    stream.emit(Failed("boom", "x"))
    stream.emit(AnswerDelta("late"))
    assert stream.done
    assert list(stream.events()) == got == stream.history == [PromptProgress(1, 2), AnswerDelta("a"), Failed("boom", "x")]
    assert stream.wait(0) == Failed("boom", "x")
    late = []
    stream.add_listener(late.append)  # a listener added after the end gets the whole stream, at once
    assert late == got


def test_a_blocked_reader_gets_every_event_emitted_from_another_thread():
    stream = EventStream("the engine", wake_every=0.02)
    pieces = [AnswerDelta(str(i)) for i in range(200)]

    def produce() -> None:
        for piece in pieces:
            stream.emit(piece)
        time.sleep(0.05)  # the last text pieces may not wake the reader: it must find them by polling
        stream.emit(Failed("end", "x"))

    threading.Thread(target=produce).start()
    got = list(stream.events(timeout=5))
    assert got == [*pieces, Failed("end", "x")]


def test_waits_time_out_naming_what_they_wait_for():
    stream = EventStream("the turn")
    stream.emit(AnswerDelta("a"))
    with pytest.raises(TimeoutError, match="the turn did not finish"):
        stream.wait(0.05)
    reader = stream.events(timeout=0.05)
    assert next(reader) == AnswerDelta("a")
    with pytest.raises(TimeoutError, match="no event from the turn"):
        next(reader)


def test_a_listener_that_raises_is_logged_and_the_others_are_still_served(caplog):
    stream = EventStream("the turn")
    before, broken_got, after = [], [], []

    def broken(event):
        broken_got.append(event)
        raise RuntimeError("listener bug")

    stream.add_listener(before.append)
    stream.add_listener(broken)
    stream.add_listener(after.append)
    with caplog.at_level(logging.ERROR, logger="macapp.core.event_stream"):
        stream.emit(AnswerDelta("a"))
        stream.emit(Failed("end", "x"))
    assert before == broken_got == after == stream.history == [AnswerDelta("a"), Failed("end", "x")]
    failures = [r for r in caplog.records if "listener" in r.getMessage()]
    assert len(failures) == 2 and all("the turn" in r.getMessage() and "listener bug" in str(r.exc_info[1]) for r in failures)


def test_a_listener_added_while_events_flow_gets_each_once_in_order_from_the_thread_delivering_it():
    stream = EventStream("the engine")
    first, go, produced = threading.Event(), threading.Event(), threading.Event()
    stream.add_listener(lambda e: first.set())
    head = [AnswerDelta(str(i)) for i in range(50)]
    tail = [AnswerDelta(str(i)) for i in range(50, 100)]

    def produce() -> None:
        for event in head:
            stream.emit(event)
        go.wait(5)
        for event in [*tail, Failed("end", "x")]:
            stream.emit(event)
        produced.set()

    producer = threading.Thread(target=produce)
    producer.start()
    assert first.wait(5)
    me = threading.current_thread()
    got, threads = [], []

    def listener(event):
        if not got:  # the replay is under way on this thread: let the producer emit the rest meanwhile
            go.set()
            assert produced.wait(5)
        got.append(event)
        threads.append(threading.current_thread())

    stream.add_listener(listener)
    producer.join(5)
    assert got == stream.history == [*head, *tail, Failed("end", "x")]
    assert set(threads) == {me}  # what came during the replay was delivered by the replaying thread, after the rest


def test_wait_returns_once_the_listeners_on_the_emitting_thread_have_the_terminal_event():
    stream = EventStream("the turn")
    holding, release, got = threading.Event(), threading.Event(), []

    def slow(event):
        if isinstance(event, Failed):
            holding.set()
            release.wait(5)
        got.append(event)

    stream.add_listener(slow)
    emitter = threading.Thread(target=stream.emit, args=(Failed("end", "x"),))
    emitter.start()
    assert holding.wait(5)
    assert stream.done  # the terminal event is in: nothing else is taken
    with pytest.raises(TimeoutError):
        stream.wait(0.05)  # but a listener is still being handed it
    release.set()
    assert stream.wait(5) == Failed("end", "x") and got == [Failed("end", "x")]
    emitter.join(5)
