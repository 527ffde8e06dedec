"""One recorder for every front end: the same turns through the window and through `qwen-desk chat` leave the
same history rows (send, stop, regenerate, edit, a refused turn, a failure, and a turn after it)."""

from __future__ import annotations

import io
import threading
from dataclasses import replace

from PySide6.QtCore import Qt

from macapp.cli import chat as cli_chat
from macapp.core.events import TurnKind
from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING
from tests.ui.helpers import NO_END, stop_after_pieces, worker_held

ANSWER = "".join(SCRIPT_ANSWER)
REASONING = "".join(SCRIPT_REASONING)
LONG = {**NO_END, "max_tokens": 4000}
# kv_group_size 128 cannot quantize the tiny model's 64-wide heads: mlx fails once the cache passes `start`,
# set a few tokens past the failing turn's prompt, so its reply has begun when it fails.
FAIL_AFTER = 4

# (kind, text, thinking, what the test does to the turn)
SCRIPT = [
    (TurnKind.SEND, "First question", True, None),
    (TurnKind.SEND, "Tell me a long story", False, "stop"),
    (TurnKind.SEND, "Another one", False, None),
    (TurnKind.REGENERATE, "", True, None),
    (TurnKind.EDIT, "Another one, edited", False, None),
    (TurnKind.SEND, "This will not fit", False, "refuse"),
    (TurnKind.SEND, "This will fail", True, "fail"),
    (TurnKind.SEND, "After the failure", False, None),
]


def _prepare(session, twist, text, thinking):
    """Change the session's options for the turn (refuse: no room left; fail: a KV quantization mlx refuses)."""
    before = session.options
    if twist == "refuse":
        session.options = replace(before, context_limit=session.context_tokens + 8)
    elif twist == "fail":
        turn = session.engine.model.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, enable_thinking=thinking)
        start = session.context_tokens + len(turn) + 2 + FAIL_AFTER  # + the previous reply's closing "<|im_end|>\n"
        session.options = replace(before, kv_bits=4, kv_group_size=128, quantized_kv_start=start)
    return before


class WindowDriver:
    """The turns as a person runs them: the composer, Enter, the Regenerate and Edit Last buttons."""

    def __init__(self, chat, qtbot):
        self.chat, self.qtbot = chat, qtbot
        self.controller = chat.controller

    def turn(self, kind, text, thinking, twist):
        chat, controller = self.chat, self.controller
        controller.sampling_overrides = LONG if twist == "stop" else {}
        before = _prepare(controller.session, twist, text, thinking) if twist in ("refuse", "fail") else None
        chat.composer.thinking.setChecked(thinking)
        with worker_held(controller.engine):
            if kind is TurnKind.REGENERATE:
                chat.regenerate_button.click()
            else:
                if kind is TurnKind.EDIT:
                    chat.edit_button.click()
                chat.composer.input.setPlainText(text)
                self.qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
            assert chat.busy
            if twist == "stop":
                stop_after_pieces(controller.job, 12)
        self.qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
        if twist == "refuse":
            assert chat.error.isVisible() and chat.composer.input.toPlainText() == text
            controller.session.options = before
            chat.composer.input.clear()

    def conversation_id(self):
        return self.controller.conversation_id


class CliDriver:
    """The same turns through qwen-desk chat's own turn runner (what --prompt, /regen and /edit run)."""

    def __init__(self, engine, model_name, sampling):
        from macapp.core.engine import SessionOptions

        options = SessionOptions()
        self.history = cli_chat.History(True, model_name, None, {}, None)
        self.chat = cli_chat.Chat(engine, engine.new_session(options=options), self.history, None, options)
        self.sampling = sampling
        self.out = io.StringIO()

    def turn(self, kind, text, thinking, twist):
        session = self.chat.session
        before = _prepare(session, twist, text, thinking) if twist in ("refuse", "fail") else None
        params, budget = self.sampling(thinking, LONG if twist == "stop" else {})
        run = lambda: self.chat.turn(kind, text, thinking, params, budget, self.out)  # noqa: E731
        if twist != "stop":
            run()
        else:  # Ctrl-C at an exact point: a listener stops the job from the worker, as the window's test does
            previous = session.last_job
            thread = threading.Thread(target=run)
            with worker_held(self.chat.engine):
                thread.start()
                while session.last_job is previous:
                    threading.Event().wait(0.01)
                stop_after_pieces(session.last_job, 12)
            thread.join(60)
        if before is not None and self.chat.session is session:
            session.options = before

    def conversation_id(self):
        return self.history.conversation_id


def _rows(store, conversation_id):
    return [
        (
            m.position,
            m.role,
            m.content,
            m.reasoning,
            m.thinking,
            m.state,
            m.finish_reason,
            m.model,
            m.stats.prompt_tokens,
            m.stats.generation_tokens,
            m.stats.reasoning_tokens,
        )
        for m in store.get_conversation(conversation_id).messages
    ]


def test_the_window_and_the_command_line_record_the_same_turns_the_same_way(chat, qtbot, tmp_path):
    from macapp.core.engine import Engine
    from macapp.core.prompt_disk import DiskStore
    from macapp.core.prompt_disk.shelf import shelves

    window = WindowDriver(chat, qtbot)
    for kind, text, thinking, twist in SCRIPT:
        window.turn(kind, text, thinking, twist)
    store = chat.controller.store
    seen = _rows(store, window.conversation_id())

    def sampling(thinking, overrides):
        chat.controller.sampling_overrides = overrides
        return chat.controller.sampling(thinking)  # the very settings the window used

    engine = Engine()
    # `qwen-desk chat` shelves its positions on disk as the window does (cli.cache.open_store), here in a store of its
    # own: after the failed turn both find the same shelved position (the window's store would give it more)
    disk = DiskStore(tmp_path / "cli-prompts", 1 << 30)
    engine.position_shelf = shelves(disk)
    try:
        loaded = engine.load(str(chat.controller.model_ref.local_path)).result(timeout=120)
        cli = CliDriver(engine, chat.controller.model_ref.name, sampling)
        try:
            for kind, text, thinking, twist in SCRIPT:
                cli.turn(kind, text, thinking, twist)
            assert cli.conversation_id() != window.conversation_id()
            assert _rows(store, cli.conversation_id()) == seen
        finally:
            cli.history.close()
    finally:
        engine.close()
        disk.close()

    assert loaded.name == chat.controller.model_ref.name  # the same name the command line records by itself
    contents = [(role, content, state, reason) for _p, role, content, _r, _t, state, reason, *_ in seen]
    stopped, failed = contents[3], contents[7]
    assert contents[:3] == [
        ("user", "First question", "complete", None),
        ("assistant", ANSWER, "complete", "stop"),
        ("user", "Tell me a long story", "complete", None),
    ]
    assert stopped[0] == "assistant" and stopped[2:] == ("stopped", "stopped") and stopped[1]
    assert contents[4:7] == [
        ("user", "Another one, edited", "complete", None),
        ("assistant", ANSWER, "complete", "stop"),
        ("user", "This will fail", "complete", None),
    ]  # the refused message left nothing
    assert failed[0] == "assistant" and failed[2:] == ("stopped", "error") and seen[7][3]  # the reasoning so far kept
    assert contents[8:] == [("user", "After the failure", "complete", None), ("assistant", ANSWER, "complete", "stop")]
    assert seen[1][3] == REASONING and seen[1][4] is True  # thinking on: reasoning kept apart
