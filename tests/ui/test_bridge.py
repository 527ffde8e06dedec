"""EventBridge: a job's events from another thread arrive on the GUI thread in coalesced batches, in order; the
bridge ends with the terminal event and deletes itself, and nothing the producer does afterwards raises."""

from __future__ import annotations

import gc
import threading

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QThread

from macapp.core.engine import Job
from macapp.core.events import AnswerDelta, Finished, GenerationStats, Reply, StatsUpdate
from macapp.ui.bridge import EventBridge


def _settle(qtbot) -> None:
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    qtbot.wait(1)
    gc.collect()


def test_events_from_a_worker_thread_arrive_coalesced_in_order_on_the_gui_thread(qtbot):
    bridge = EventBridge(interval_ms=20)
    batches, threads = [], []
    bridge.delivered.connect(lambda batch: (batches.append(batch), threads.append(QThread.currentThread())))
    job = Job("chat")
    bridge.attach(job)
    pieces = [f"w{i} " for i in range(500)]

    def produce():
        for i, piece in enumerate(pieces):
            job.emit(AnswerDelta(piece))
            if i % 100 == 0:
                job.emit(StatsUpdate(GenerationStats(generation_tokens=i)))
        job.emit(Finished(Reply(text="".join(pieces))))

    worker = threading.Thread(target=produce)
    worker.start()
    worker.join()  # every event is pending before the GUI thread runs again: one deterministic batch
    qtbot.waitUntil(lambda: bool(batches) and isinstance(batches[-1][-1], Finished), timeout=60_000)
    events = [e for batch in batches for e in batch]
    assert "".join(e.text for e in events if isinstance(e, AnswerDelta)) == "".join(pieces)  # nothing lost, in order
    # Runs of text joined, each StatsUpdate kept in its place: [w0] s0 [w1..w100] s100 … s400 [w401..w499] Finished
    assert [type(e) for e in events] == [AnswerDelta, StatsUpdate] * 5 + [AnswerDelta, Finished]
    assert [e.stats.generation_tokens for e in events if isinstance(e, StatsUpdate)] == [0, 100, 200, 300, 400]
    assert [type(e) for e in events].count(Finished) == 1 and isinstance(events[-1], Finished)
    assert set(threads) == {QCoreApplication.instance().thread()}
    assert bridge.finished


def test_the_bridge_deletes_itself_after_the_terminal_batch_and_ignores_late_events(qtbot):
    owner = QObject()  # as the chat controller owns its bridges: Python dropping its reference deletes nothing
    job = Job("chat")
    bridge = EventBridge(interval_ms=20, parent=owner)
    seen = []
    bridge.delivered.connect(seen.append)
    bridge.attach(job)
    job.emit(AnswerDelta("hi"))
    assert owner.findChildren(EventBridge) == [bridge]
    job.emit(Finished(Reply(text="hi")))
    qtbot.waitUntil(lambda: bool(seen) and isinstance(seen[-1][-1], Finished), timeout=60_000)
    del bridge
    _settle(qtbot)
    assert owner.findChildren(EventBridge) == []  # deleted itself after its final batch; the job lives on
    job.emit(AnswerDelta("late"))  # a job ignores events after its terminal one
    assert [e for batch in seen for e in batch] == [AnswerDelta("hi"), Finished(Reply(text="hi"))]


def test_a_bridge_fed_after_its_terminal_event_does_not_raise(qtbot):
    bridge = EventBridge(interval_ms=20)
    seen = []
    bridge.delivered.connect(seen.append)
    bridge.start()
    bridge.feed(Finished(Reply(text="done")))
    bridge.flush()
    assert bridge.finished and len(seen) == 1
    bridge.feed(AnswerDelta("after"))  # e.g. a producer that did not see the end yet
    bridge.flush()
    assert len(seen) == 1
