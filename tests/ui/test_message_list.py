"""MessageList with real widgets and the engine's real event records (no model needed)."""

from __future__ import annotations

import pytest

from macapp.core.events import AnswerDelta, Finished, GenerationStats, ReasoningDelta, Reply, StatsUpdate, TurnKind
from macapp.core.history import Message, ReplyStats
from macapp.core.recorder import TurnOutcome, TurnResult
from macapp.ui.chat_controller import TurnEnd, TurnStart
from macapp.ui.message_list import MessageList


@pytest.fixture
def messages(qtbot):
    widget = MessageList()
    qtbot.addWidget(widget)
    widget.show()
    return widget


def _saved(*pairs):
    out = []
    for i, (question, answer) in enumerate(pairs):
        out.append(Message(0, 1, 2 * i, "user", question))
        out.append(Message(0, 1, 2 * i + 1, "assistant", answer, stats=ReplyStats(generation_tokens=3)))
    return out


def _end(kind, result, reply=None):
    return TurnEnd(TurnOutcome(kind, result, "typed"), reply, None)


def _texts(messages):
    return [(w.role, w.text if w.role == "user" else w.view.source_text) for w in messages.widgets()]


def test_a_saved_conversation_is_shown_and_the_empty_note_hidden(messages):
    assert messages.empty.isVisibleTo(messages)
    messages.show_conversation(_saved(("q1", "a1"), ("q2", "a2")))
    assert _texts(messages) == [("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2")]
    assert not messages.empty.isVisibleTo(messages)
    assert "3 tokens" in messages.widgets()[1].stats_label.text()
    assert messages.last_index("user") == 2 and messages.last_index("assistant") == 3


def test_a_reply_streams_in_batches_and_is_finished_once(messages):
    messages.begin_turn(TurnStart(TurnKind.SEND, "hello", True))
    messages.show_events([ReasoningDelta("Let me"), ReasoningDelta(" think."), StatsUpdate(GenerationStats(generation_tokens=2))])
    messages.show_events([AnswerDelta("Hi"), AnswerDelta(" there")])
    reply = messages.current
    assert messages.renders == 2 and reply.view.source_text == "Hi there" and reply.reasoning.text == "Let me think."
    final = Reply(text="Hi there!", reasoning="Let me think.", finish_reason="length", stats=GenerationStats(generation_tokens=4))
    messages.show_events([AnswerDelta("!"), Finished(final)])
    assert messages.renders == 2  # the final batch is rendered by settle, exactly
    messages.settle(_end(TurnKind.SEND, TurnResult.COMPLETE, final))
    assert messages.current is None and reply.view.source_text == "Hi there!"
    assert "4 tokens" in reply.stats_label.text() and "max tokens" in reply.stats_label.text()


@pytest.mark.parametrize("kind", [TurnKind.REGENERATE, TurnKind.EDIT])
def test_a_replaced_turn_is_hidden_until_the_new_reply_is_under_way(messages, kind, qtbot):
    messages.show_conversation(_saved(("q1", "a1"), ("q2", "a2")))
    qtbot.wait(1)
    assert all(w.isVisibleTo(messages) for w in messages.widgets())
    messages.begin_turn(TurnStart(kind, "q2 edited" if kind is TurnKind.EDIT else "", False))
    old = messages.widgets()[2 if kind is TurnKind.EDIT else 3 : 4]
    assert all(not w.isVisibleTo(messages) for w in old)
    messages.replace_old_turn()
    messages.show_events([AnswerDelta("new")])
    messages.settle(_end(kind, TurnResult.COMPLETE, Reply(text="new")))
    expected_user = "q2 edited" if kind is TurnKind.EDIT else "q2"
    assert _texts(messages) == [("user", "q1"), ("assistant", "a1"), ("user", expected_user), ("assistant", "new")]


@pytest.mark.parametrize("kind", [TurnKind.SEND, TurnKind.REGENERATE, TurnKind.EDIT])
def test_a_turn_that_never_got_under_way_is_taken_out_and_the_old_turn_shown(messages, kind, qtbot):
    messages.show_conversation(_saved(("q1", "a1")))
    messages.begin_turn(TurnStart(kind, "" if kind is TurnKind.REGENERATE else "new question", False))
    assert len(messages.widgets()) > 2
    messages.settle(_end(kind, TurnResult.UNDONE))
    qtbot.wait(1)  # a layout shows the widgets added to it from the event loop
    assert _texts(messages) == [("user", "q1"), ("assistant", "a1")]
    assert all(w.isVisibleTo(messages) for w in messages.widgets())


def test_a_failed_reply_keeps_its_text_with_a_note(messages):
    messages.begin_turn(TurnStart(TurnKind.SEND, "hello", False))
    messages.replace_old_turn()
    messages.show_events([AnswerDelta("half")])
    messages.settle(_end(TurnKind.SEND, TurnResult.FAILED))
    reply = messages.widgets()[-1]
    assert reply.view.source_text == "half" and "stopped by an error" in reply.stats_label.text()


def test_cleared_messages_stop_painting_before_they_are_deleted(messages):
    messages.show_conversation(_saved(("q1", "a1")))
    old = messages.widgets()
    messages.clear()  # deleteLater: the widgets live until the event loop runs again
    assert messages.widgets() == [] and not any(w.isVisible() for w in old)


def _with_picture(tmp_path, question="what is this?"):
    """A saved user message with a real picture in the pictures folder (as the recorder saves it)."""
    from PIL import Image

    from macapp.core.vision.images import open_image
    from macapp.core.vision.pictures import save_picture

    path = tmp_path / "red.png"
    Image.new("RGB", (96, 64), (200, 30, 30)).save(path)
    ref = save_picture(open_image(path))
    return [Message(0, 1, 0, "user", question, images=(ref,)), Message(0, 1, 1, "assistant", "a picture")]


def test_a_saved_messages_pictures_arrive_from_their_thread(messages, qtbot, tmp_path):
    with qtbot.waitSignal(messages.pictures_shown, timeout=60_000):
        messages.show_conversation(_with_picture(tmp_path))
        user = messages.widgets()[0]
        assert user.thumbnails == [] and user.text == "what is this?"  # the text at once, the pictures later
    assert len(user.thumbnails) == 1 and user.pictures[0].size == (96, 64)


def test_pictures_read_for_a_conversation_no_longer_shown_are_dropped(messages, qtbot, tmp_path):
    shown = []
    messages.pictures_shown.connect(lambda: shown.append(True))
    messages.show_conversation(_with_picture(tmp_path))
    first = messages.widgets()[0]
    messages.show_conversation(_saved(("another", "conversation")))  # before the pictures could arrive
    with qtbot.waitSignal(messages.pictures_shown, timeout=60_000):  # the same conversation again: its own arrive
        messages.show_conversation(_with_picture(tmp_path, "again"))
    assert len(shown) == 1 and first.thumbnails == [] and len(messages.widgets()[0].thumbnails) == 1
