"""The chat page on a real tiny model through the real engine (greedy decoding follows the model's script)."""

import threading
import time

from PySide6.QtCore import Qt

from macapp.core.events import PromptProgress
from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING
from tests.ui.helpers import GREEDY, NO_END, edited, open_conversation, send, worker_held

REASONING = "".join(SCRIPT_REASONING)
ANSWER = "".join(SCRIPT_ANSWER)


def test_chat_with_thinking_on_then_off(chat, qtbot, window):
    reply = send(chat, qtbot, "What is the answer?", thinking=True)
    assert reply.role == "assistant"
    assert reply.reasoning is not None and reply.reasoning.text.strip() == REASONING
    assert not reply.reasoning.expanded  # folded once the answer started
    assert reply.reasoning.header.text().startswith("Thought for")
    assert reply.view.source_text == ANSWER
    assert "tok/s" in reply.stats_label.text() and "tokens" in reply.stats_label.text()
    assert "tokens of context in use" in chat.meter.text()
    window.status.refresh_memory()  # the status bar polls every 2 s; the app's own share now includes MLX's
    assert "(model + cache)" in window.status.app_label.text()
    assert window.status.model_label.text().startswith("Loaded tiny-qwen3.5-moe")

    reply = send(chat, qtbot, "And without thinking?", thinking=False)
    assert reply.reasoning is None
    assert reply.view.source_text == ANSWER

    # Both turns are in the history store, reasoning kept apart.
    conv = chat.controller.store.get_conversation(chat.controller.conversation_id)
    assert [m.role for m in conv.messages] == ["user", "assistant", "user", "assistant"]
    assert conv.messages[1].reasoning.strip() == REASONING and conv.messages[1].content == ANSWER
    assert conv.messages[3].stats.generation_tokens > 0
    assert window.sidebar.conversations.count() == 1
    assert window.sidebar.conversations.item(0).text() == "What is the answer?"


def test_shift_enter_adds_a_line_instead_of_sending(chat, qtbot):
    chat.composer.input.setPlainText("first line")
    chat.composer.input.moveCursor(chat.composer.input.textCursor().MoveOperation.End)
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert not chat.busy
    assert chat.composer.input.toPlainText() == "first line\n"


def test_stop_keeps_what_was_written_then_regenerate_replaces_it(chat, settings, qtbot, window):
    settings.set("chat.sampling.instant", {**GREEDY, "max_tokens": 4000})
    chat.controller.sampling_overrides = NO_END
    chat.composer.thinking.setChecked(False)
    chat.composer.input.setPlainText("Tell me a long story")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: chat.messages.current is not None and len(chat.messages.current.answer) > 20, timeout=60_000)
    qtbot.keyClick(window, Qt.Key.Key_Escape)  # Esc stops
    # Waited on the state, not timed: a reply that ignored Esc would run on to its 4000 tokens and end "length".
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    stopped = chat.messages.widgets()[-1]
    assert "stopped" in stopped.stats_label.text()
    assert stopped.stats.generation_tokens < 4000
    saved = chat.controller.store.get_conversation(chat.controller.conversation_id).messages
    assert saved[-1].state == "stopped" and saved[-1].content == stopped.answer

    chat.controller.sampling_overrides = {}
    assert chat.regenerate_button.isEnabled()
    chat.regenerate_button.click()
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    widgets = chat.messages.widgets()
    assert [w.role for w in widgets] == ["user", "assistant"]
    assert widgets[-1].view.source_text == ANSWER
    saved = chat.controller.store.get_conversation(chat.controller.conversation_id).messages
    assert [m.role for m in saved] == ["user", "assistant"] and saved[-1].content == ANSWER


def test_edit_and_resend_the_last_message(chat, qtbot):
    send(chat, qtbot, "Frist try", thinking=False)
    chat.edit_button.click()
    assert chat.composer.input.toPlainText() == "Frist try"
    chat.composer.input.setPlainText("First try")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    widgets = chat.messages.widgets()
    assert [w.role for w in widgets] == ["user", "assistant"]
    assert widgets[0].text == "First try" and widgets[1].view.source_text == ANSWER
    saved = chat.controller.store.get_conversation(chat.controller.conversation_id).messages
    assert [m.content for m in saved] == ["First try", ANSWER]


def test_repaints_are_capped_at_about_30_a_second(chat, settings, qtbot):
    settings.set("chat.sampling.instant", {**GREEDY, "max_tokens": 300})
    chat.controller.sampling_overrides = NO_END
    chat.messages.renders = 0
    chat.composer.thinking.setChecked(False)
    chat.composer.input.setPlainText("Write a lot")
    t0 = time.monotonic()
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    throttle = chat.controller.flight.bridge.throttle  # the reply's bridge is released once it has ended
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    elapsed = time.monotonic() - t0
    reply = chat.messages.widgets()[-1]
    tokens = reply.stats.generation_tokens
    assert tokens > 100 and throttle.offered > tokens / 2  # about one event per token
    # At most ~30 batches a second (+ the final flush), however fast the tokens come (an upper bound: a slower
    # machine only paints less often).
    assert chat.messages.renders <= elapsed * 30 * 1.3 + 3, (chat.messages.renders, elapsed, tokens)
    assert reply.view.renders <= chat.messages.renders + 2  # one per batch, + the empty start and the exact final render


def test_tokens_that_arrive_while_the_gui_is_busy_are_painted_in_one_batch(chat, settings, qtbot):
    """However fast or slow this machine makes tokens, a GUI thread that is busy for the whole reply gets it joined:
    the worker only queues, so the GUI thread is held here until the reply has ended (an event, not a clock)."""
    settings.set("chat.sampling.instant", {**GREEDY, "max_tokens": 300})
    chat.controller.sampling_overrides = NO_END
    chat.composer.thinking.setChecked(False)
    chat.composer.input.setPlainText("Write a lot")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    flight = chat.controller.flight
    throttle = flight.bridge.throttle
    chat.messages.renders = 0
    flight.turn.wait(60)  # the GUI thread blocked: every token of the reply is queued meanwhile
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    reply = chat.messages.widgets()[-1]
    assert reply.stats.generation_tokens > 100 and throttle.offered > 100
    assert chat.messages.renders <= 3, (chat.messages.renders, throttle.offered)  # not one per token


def test_new_chat_then_reopen_restores_and_continues(chat, qtbot, window):
    send(chat, qtbot, "Remember me", thinking=True)
    first_id = chat.controller.conversation_id
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)  # Ctrl/Cmd+N
    assert chat.controller.conversation_id is None and chat.messages.widgets() == []
    assert window.sidebar.conversations.count() == 1
    open_conversation(window, qtbot, first_id)
    widgets = chat.messages.widgets()
    assert [w.role for w in widgets] == ["user", "assistant"]
    assert widgets[1].reasoning is not None and widgets[1].view.source_text == ANSWER
    assert chat.controller.session is None and chat.controller.conversation_id == first_id  # read on the next turn
    chat.controller.prompt_disk.flush()  # the first turn's checkpoints are on disk (written off the decode path)
    reply = send(chat, qtbot, "Still there?", thinking=False)
    assert reply.view.source_text == ANSWER
    assert chat.controller.session is not None
    # The reopened conversation is read as its session held it (the first reply in the tokens the history saved), so
    # the checkpoint that session left on disk after its reply matches whole: only the new message is read, as if
    # the conversation had never been closed (docs/prompt-cache.md).
    session = chat.controller.session
    tokenizer = session.engine.model.tokenizer
    first_turn = tokenizer.apply_chat_template([{"role": "user", "content": "Remember me"}], add_generation_prompt=True, enable_thinking=True)
    new_turn = tokenizer.apply_chat_template([{"role": "user", "content": "Still there?"}], add_generation_prompt=True, enable_thinking=False)
    assert reply.stats.prompt_tokens == 1 + len(new_turn)  # "\n" after the first reply's <|im_end|>, then the new message
    first_reply = chat.controller.store.get_conversation(first_id).messages[1]
    assert session.context_tokens == len(first_turn) + len(first_reply.cache_tokens) + reply.stats.prompt_tokens + reply.stats.generation_tokens
    assert [m["role"] for m in chat.controller.session.messages] == ["user", "assistant", "user", "assistant"]


def test_reading_progress_is_shown_for_a_long_prompt(chat, qtbot):
    seen = []
    partly = threading.Event()  # the meter has shown a step of the reading
    original = chat.meter.show_progress

    def show_progress(p, t):
        seen.append((p, t))
        original(p, t)
        if 0 < p < t:
            partly.set()

    def hold_until_shown(event):  # on the worker: the prefill waits, mid-prompt, until the window has shown it
        if isinstance(event, PromptProgress) and 0 < event.processed < event.total:
            partly.wait(60)

    chat.meter.show_progress = show_progress
    long_prompt = " ".join(["the answer is here"] * 600)
    with worker_held(chat.controller.engine):
        chat.composer.thinking.setChecked(False)
        chat.composer.input.setPlainText(long_prompt)
        qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
        chat.controller.job.add_listener(hold_until_shown)  # before the job runs: the worker is parked
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    assert seen and seen[-1][1] > 2048
    assert any(0 < p < t for p, t in seen)  # a step of the reading was shown, not only its end
    assert [p for p, _ in seen] == sorted(p for p, _ in seen) and seen[-1][0] == seen[-1][1]


def test_delete_a_conversation_from_the_sidebar(chat, qtbot, window):
    send(chat, qtbot, "Short lived", thinking=False)
    key = chat.controller.conversation_id
    assert window.sidebar.conversations.count() == 1
    with edited(window, qtbot):  # deleted off the GUI thread
        assert window.delete_conversation(key, confirm=False)
    assert window.sidebar.conversations.count() == 0 and chat.controller.conversation_id is None
    assert chat.controller.store.list_conversations() == []


def test_new_chat_while_a_reply_streams_stops_and_saves_it(chat, settings, qtbot):
    settings.set("chat.sampling.instant", {**GREEDY, "max_tokens": 4000})
    chat.controller.sampling_overrides = NO_END
    chat.composer.thinking.setChecked(False)
    chat.send("Keep talking")
    qtbot.waitUntil(lambda: chat.messages.current is not None and len(chat.messages.current.answer) > 10, timeout=60_000)
    first = chat.controller.conversation_id  # the history's conversation is made off the GUI thread, as the reply begins
    chat.new_chat()
    assert not chat.busy and chat.controller.conversation_id is None
    qtbot.waitUntil(lambda: chat.controller.store.get_conversation(first).messages[-1].state != "streaming", timeout=60_000)
    saved = chat.controller.store.get_conversation(first).messages
    assert [m.role for m in saved] == ["user", "assistant"]
    assert saved[-1].state == "stopped" and saved[-1].content.startswith("The answer is here")
    # The next chat works normally.
    chat.controller.sampling_overrides = {}
    settings.set("chat.sampling.instant", GREEDY)
    reply = send(chat, qtbot, "Fresh start", thinking=False)
    assert reply.view.source_text == ANSWER


def test_unload_frees_the_model_and_keeps_the_conversation(chat, qtbot, window, library):
    send(chat, qtbot, "Before unloading", thinking=False)
    window.unload_action.trigger()
    assert chat.controller.model_ref is None and not chat.composer.send_button.isEnabled()
    qtbot.waitUntil(lambda: "unloaded" in chat.meter.text(), timeout=60_000)
    assert window.status.model_label.text() == "No model loaded"
    assert len(chat.messages.widgets()) == 2
    # Loading again continues the same conversation (read once into the new session).
    with qtbot.waitSignal(chat.controller.model_ready, timeout=60_000):
        library.request_load()
    reply = send(chat, qtbot, "After loading again", thinking=False)
    assert reply.view.source_text == ANSWER
    assert [m["role"] for m in chat.controller.session.messages] == ["user", "assistant", "user", "assistant"]


def _limit_context(chat, tokens):
    from dataclasses import replace

    chat.controller.session.options = replace(chat.controller.session.options, context_limit=tokens)


def test_a_refused_regenerate_keeps_the_old_reply(chat, qtbot):
    send(chat, qtbot, "Keep my reply", thinking=False)
    _limit_context(chat, 4)  # the engine now refuses any turn: too little context left
    chat.regenerate_button.click()
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    assert chat.error.isVisible() and "context" in chat.error.text()
    widgets = chat.messages.widgets()
    assert [w.role for w in widgets] == ["user", "assistant"]
    assert all(w.isVisibleTo(chat) for w in widgets) and widgets[1].view.source_text == ANSWER
    saved = chat.controller.store.get_conversation(chat.controller.conversation_id).messages
    assert [(m.role, m.content) for m in saved] == [("user", "Keep my reply"), ("assistant", ANSWER)]
    # The next regenerate (the limit gone with a fresh session) replaces it for real.
    chat.controller.session = None
    chat.regenerate_button.click()
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    saved = chat.controller.store.get_conversation(chat.controller.conversation_id).messages
    assert [m.role for m in saved] == ["user", "assistant"] and [w.role for w in chat.messages.widgets()] == ["user", "assistant"]


def test_a_refused_edit_keeps_the_old_turn_and_the_typed_text(chat, qtbot):
    send(chat, qtbot, "Original question", thinking=False)
    _limit_context(chat, 4)
    chat.edit_button.click()
    chat.composer.input.setPlainText("Edited question")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    assert chat.error.isVisible()
    assert chat.composer.input.toPlainText() == "Edited question"
    widgets = chat.messages.widgets()
    assert [w.role for w in widgets] == ["user", "assistant"] and widgets[0].text == "Original question"
    assert all(w.isVisibleTo(chat) for w in widgets)
    saved = chat.controller.store.get_conversation(chat.controller.conversation_id).messages
    assert [m.content for m in saved] == ["Original question", ANSWER]


def test_bad_sampling_settings_keep_the_typed_text_and_save_nothing(chat, settings, qtbot):
    settings.set("chat.sampling.instant", {**GREEDY, "top_p": 0.0})  # validate() refuses top_p = 0
    chat.composer.thinking.setChecked(False)
    chat.composer.input.setPlainText("Do not lose me")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    assert not chat.busy
    assert chat.composer.input.toPlainText() == "Do not lose me"
    assert chat.error.isVisible() and "top_p" in chat.error.text()
    assert chat.messages.widgets() == [] and chat.controller.store.list_conversations() == []


def test_a_read_only_history_still_chats_and_says_it_is_not_saved(chat, qtbot, window):
    send(chat, qtbot, "Saved before", thinking=False)
    kept = chat.controller.store.get_conversation(chat.controller.conversation_id)
    chat.controller.store.database.read_only = True  # what Store.open gives for a history written by a newer app
    chat.controller.store.notice = "This chat history was written by a newer version of Qwen Desk."
    seen = []
    chat.controller.history_notice.connect(seen.append)
    reply = send(chat, qtbot, "After it became read-only", thinking=False)
    assert reply.view.source_text == ANSWER and not chat.error.isVisible()
    assert chat.controller.unsaved and chat.notice.isVisible() and "not being saved" in chat.notice.text()
    assert len(seen) == 1 and window.status.notice_label.isVisible()
    send(chat, qtbot, "Once more", thinking=False)
    assert len(seen) == 1  # told once
    # The read-only history itself was not written to.
    assert len(chat.controller.history.read_only_store.get_conversation(kept.id).messages) == len(kept.messages)


def test_unloading_while_a_reply_streams_records_it_and_shows_what_was_saved(chat, settings, qtbot, window):
    settings.set("chat.sampling.instant", {**GREEDY, "max_tokens": 4000})
    chat.controller.sampling_overrides = NO_END
    chat.composer.thinking.setChecked(False)
    assert chat.send("Keep going")
    qtbot.waitUntil(lambda: chat.messages.current is not None and len(chat.messages.current.answer) > 10, timeout=60_000)
    window.unload_action.trigger()
    assert not chat.busy and chat.messages.current is None
    store, key = chat.controller.store, chat.controller.conversation_id
    qtbot.waitUntil(lambda: store.get_conversation(key).messages[-1].state != "streaming", timeout=60_000)
    saved = store.get_conversation(key).messages
    assert [m.role for m in saved] == ["user", "assistant"] and saved[-1].state == "stopped"
    qtbot.waitUntil(lambda: chat.messages.widgets()[-1].view.source_text == saved[-1].content, timeout=60_000)
    assert len(chat.messages.widgets()) == 2 and "stopped" in chat.messages.widgets()[-1].stats_label.text()


def test_a_message_the_history_cannot_save_is_not_sent_and_is_given_back(chat, qtbot):
    store = chat.controller.store
    with store.database.write() as conn:  # a real SQLite refusal, as a full disk gives
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON messages BEGIN SELECT RAISE(ABORT, 'disk is full'); END")
    chat.composer.thinking.setChecked(False)
    chat.composer.input.setPlainText("Keep me")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    assert chat.error.isVisible() and "Could not send" in chat.error.text() and "disk is full" in chat.error.text()
    assert chat.composer.input.toPlainText() == "Keep me"  # what they typed is never lost
    assert chat.messages.widgets() == []
    with store.database.write() as conn:
        conn.execute("DROP TRIGGER refuse")
    chat.composer.input.clear()
    reply = send(chat, qtbot, "Now it saves", thinking=False)
    assert reply.view.source_text == ANSWER
    saved = store.get_conversation(chat.controller.conversation_id).messages
    assert [m.content for m in saved] == ["Now it saves", ANSWER]


def test_the_read_only_history_is_swapped_off_the_gui_thread(chat, qtbot, monkeypatch):
    send(chat, qtbot, "Saved before", thinking=False)
    history = chat.controller.history
    read_only = chat.controller.store
    read_only.database.read_only = True  # what Store.open gives for a history written by a newer app
    threads = []
    real = history.make_writable

    def noting(conversation_id):  # the real swap, and the thread it ran on
        threads.append(threading.current_thread())
        return real(conversation_id)

    monkeypatch.setattr(history, "make_writable", noting)
    reply = send(chat, qtbot, "After it became read-only", thinking=False)
    assert reply.view.source_text == ANSWER and not chat.error.isVisible()
    assert len(threads) == 1 and threads[0] is not threading.main_thread()
    assert chat.controller.store is not read_only and chat.controller.unsaved
    assert [m.role for m in chat.controller.store.get_conversation(chat.controller.conversation_id).messages] == ["user", "assistant"] * 2


def test_a_turn_waiting_for_the_swap_does_not_start_once_a_conversation_is_being_opened(chat, qtbot, monkeypatch):
    send(chat, qtbot, "Saved before", thinking=False)
    history = chat.controller.history
    chat.controller.store.database.read_only = True  # what Store.open gives for a history written by a newer app
    release = threading.Event()
    real = history.make_writable

    def held(conversation_id):  # the real swap, once the window has moved on
        release.wait(60)
        return real(conversation_id)

    monkeypatch.setattr(history, "make_writable", held)
    chat.composer.thinking.setChecked(False)
    chat.composer.input.setPlainText("Wait for me")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: chat.controller.starting, timeout=60_000)
    chat.controller.open_conversation(chat.controller.conversation_id)  # asked while the swap runs (read after it)
    release.set()
    qtbot.waitUntil(lambda: not chat.controller.starting and chat.controller.opening is None, timeout=60_000)
    assert chat.controller.flight is None and not chat.busy  # no turn on the conversation the window left
    assert chat.composer.input.toPlainText() == "Wait for me"  # what they typed is given back


def test_a_re_read_older_than_the_newest_turn_is_not_shown(chat, qtbot, monkeypatch):
    """A left reply's re-read (_tell_updated) delivered after a whole later turn started and ended is dropped: its
    copy of the conversation is older than what that turn shows."""
    send(chat, qtbot, "First", thinking=False)
    controller = chat.controller
    stale = controller.store.get_conversation(controller.conversation_id)  # what a read made before the next turn gives
    gate = threading.Event()
    controller.history_worker.run(lambda: gate.wait(30), lambda _r, _e: None)  # the worker is busy meanwhile
    real = controller.store.get_conversation
    monkeypatch.setattr(controller.store, "get_conversation", lambda key: stale if key == stale.id else real(key))
    updated = []
    controller.conversation_updated.connect(updated.append)
    controller._tell_updated(controller.conversation, controller.conversation_id)  # what a left reply's end asks
    chat.composer.input.setPlainText("Second")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)  # a whole turn, while the re-read waits
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    gate.set()
    qtbot.waitUntil(lambda: controller.history_worker.pending == 0, timeout=60_000)
    assert updated == []  # the stale copy was dropped
    assert [w.role for w in chat.messages.widgets()] == ["user", "assistant"] * 2
