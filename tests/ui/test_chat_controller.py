"""ChatController on the real engine and tiny model: what it signals, and what finished replies leave behind."""

from __future__ import annotations

import gc

from PySide6.QtCore import QCoreApplication, QEvent

from macapp.core.engine import Job
from macapp.core.events import AnswerDelta, Finished, TerminalEvent, TurnKind
from macapp.core.recorder import TurnResult
from macapp.ui.bridge import EventBridge
from macapp.ui.chat_controller import TurnEnd, TurnStart
from tests.ui.helpers import GREEDY, send, worker_held


def _record(controller):
    seen = []
    controller.turn_started.connect(lambda start: seen.append(start))
    controller.reply_under_way.connect(lambda: seen.append("under way"))
    controller.reply_events.connect(lambda batch: seen.append(list(batch)))
    controller.turn_settled.connect(lambda end: seen.append(end))
    return seen


def test_a_turn_is_signalled_in_order(chat, qtbot):
    seen = _record(chat.controller)
    send(chat, qtbot, "hello", thinking=False)
    start, *middle, end = seen
    assert start == TurnStart(TurnKind.SEND, "hello", False) and middle.count("under way") == 1
    first_text = next(i for i, b in enumerate(middle) if b != "under way" and any(isinstance(e, AnswerDelta) for e in b))
    assert middle.index("under way") == first_text - 1  # said just before the batch that starts the reply
    batches = [b for b in middle if b != "under way"]
    assert all(isinstance(b, list) and b for b in batches)
    events = [e for b in batches for e in b]
    assert isinstance(events[-1], Finished) and not any(isinstance(e, TerminalEvent) for e in events[:-1])
    assert "".join(e.text for e in events if isinstance(e, AnswerDelta)) == events[-1].reply.text
    assert isinstance(end, TurnEnd) and end.outcome.result is TurnResult.COMPLETE and end.reply is events[-1].reply
    assert end.outcome.reply.content == end.reply.text and not chat.controller.busy


def test_a_refused_turn_is_signalled_without_a_reply(chat, qtbot):
    from dataclasses import replace

    send(chat, qtbot, "hello", thinking=False)
    chat.controller.session.options = replace(chat.controller.session.options, context_limit=4)
    seen = _record(chat.controller)
    assert chat.controller.send("too much", thinking=False)
    qtbot.waitUntil(lambda: not chat.controller.busy, timeout=60_000)
    start, *_batches, end = seen
    assert "under way" not in seen and start.kind is TurnKind.SEND
    assert end.outcome.result is TurnResult.UNDONE and end.outcome.give_back == "too much" and end.reply is None
    assert end.outcome.code == "context_limit" and "context" in end.outcome.error


def _settle_qt(qtbot):
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # the bridges' deleteLater
    qtbot.wait(1)
    gc.collect()


def _held_by_finished_jobs():
    jobs = [o for o in gc.get_objects() if isinstance(o, Job)]
    return len(jobs), sum(len(job.history) for job in jobs)


def test_fifty_replies_leave_no_bridges_and_no_growing_event_lists(chat, settings, qtbot):
    settings.set("chat.sampling.instant", {**GREEDY, "max_tokens": 3})
    controller = chat.controller

    def live_bridges():
        return sum(isinstance(o, EventBridge) for o in gc.get_objects()), len(controller.findChildren(EventBridge))

    def settled_bridges():
        _settle_qt(qtbot)
        return live_bridges()

    # the earlier tests' bridges are deleted later (deleteLater, then the garbage collector): wait for that, not a time
    qtbot.waitUntil(lambda: settled_bridges() == (0, 0), timeout=60_000)
    with worker_held(controller.engine):
        assert controller.send("counting bridges", thinking=False)
        assert live_bridges() == (1, 1)  # the reply in flight's bridge is seen by both counts
    qtbot.waitUntil(lambda: not controller.busy, timeout=60_000)
    counts = {}
    for i in range(1, 51):
        send(chat, qtbot, f"reply {i}", thinking=False)
        if i in (10, 50):
            _settle_qt(qtbot)
            counts[i] = (live_bridges(), _held_by_finished_jobs())
    assert counts[10][0] == counts[50][0] == (0, 0)  # every reply's bridge was released after its final batch
    (jobs_10, events_10), (jobs_50, events_50) = counts[10][1], counts[50][1]
    assert jobs_50 <= jobs_10 <= 2 and events_50 <= events_10  # the session's last job at most, not 50 of them
    assert len(chat.messages.widgets()) == 2 * 51


def test_closing_the_window_mid_reply_keeps_the_reply_so_far(chat, settings, qtbot, window):
    from macapp.core.history import Store
    from tests.ui.helpers import NO_END

    settings.set("chat.sampling.instant", {**GREEDY, "max_tokens": 4000})
    chat.controller.sampling_overrides = NO_END
    assert chat.controller.send("Keep talking", thinking=False)
    qtbot.waitUntil(lambda: chat.messages.current is not None and len(chat.messages.current.answer) > 10, timeout=60_000)
    shown = chat.messages.current.answer
    key = chat.controller.conversation_id
    window.close()
    with Store.open() as store:
        user, reply = store.get_conversation(key).messages
    assert user.content == "Keep talking"
    assert reply.state == "stopped" and reply.finish_reason == "stopped" and reply.content.startswith(shown)
