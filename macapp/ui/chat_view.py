"""The chat page: streaming conversation, live meter, composer; wires the engine session and the history store."""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from macapp.core.settings import Settings
from macapp.ui.bridge import EventBridge
from macapp.ui.composer import Composer
from macapp.ui.messages import AssistantMessage, UserMessage
from macapp.ui.meter import Meter
from macapp.ui.settings import SettingsDialog, sampling_for
from macapp.ui.widgets import ElidedLabel


class ChatView(QWidget):
    repaint_interval_ms = 33  # at most ~30 repaints a second while streaming (bench/ui_bench.py tries 0)

    model_changed = Signal(str)  # status-bar text
    model_ready = Signal()
    conversations_changed = Signal()
    history_notice = Signal(str)  # the history cannot be written: chats are not saved (said once)

    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.engine = None  # created on the first load (its worker thread imports MLX, not us)
        self.session = None
        self.model_ref = None
        self.job = None  # the generation in flight
        self.load_job = None
        self.writer = None  # store.ReplyWriter for the reply in flight
        self.current: AssistantMessage | None = None
        self.conversation_id: int | None = None
        self.editing = False
        self.renders = 0  # batches rendered (tests compare it with the tokens streamed)
        self.needs_replay = False  # a reopened conversation: the engine re-reads it once on the next send
        self._store = None
        self._read_only_store = None
        self.unsaved = False  # True once chats go to a scratch history that is not kept
        self.unsaved_reason = ""
        self.model_info = None  # the engine's Loaded event
        self.sampling_overrides: dict[str, Any] = {}  # on top of the settings (benchmarks, tests, devtools)
        self._turn_kind = ""  # "send" | "regenerate" | "edit" for the reply in flight
        self._turn_text = ""
        self._turn = None
        self._pending = None  # a regenerate/edit whose old turn is hidden until the new reply is under way

        self.title = ElidedLabel("No model loaded", self)
        self.title.setObjectName("PageTitle")
        self.regenerate_button = QPushButton("Regenerate", self)
        self.edit_button = QPushButton("Edit Last", self)
        self.new_button = QPushButton("New Chat", self)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.edit_button.clicked.connect(self.edit_last)
        self.new_button.clicked.connect(self.new_chat)
        header = QHBoxLayout()
        header.addWidget(self.title, 1)
        for b in (self.regenerate_button, self.edit_button, self.new_button):
            header.addWidget(b)

        self.container = QWidget()
        self.messages_layout = QVBoxLayout(self.container)
        self.messages_layout.setContentsMargins(4, 4, 12, 4)
        self.messages_layout.setSpacing(10)
        self.empty = QLabel(self.container)
        self.empty.setObjectName("Note")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.messages_layout.addWidget(self.empty)
        self.messages_layout.addStretch(1)
        self.scroll = QScrollArea(self)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setWidget(self.container)
        self.scroll.verticalScrollBar().rangeChanged.connect(self._follow)
        self._stick_to_bottom = True
        self.scroll.verticalScrollBar().valueChanged.connect(self._on_scrolled)

        self.meter = Meter(self)
        self.error = QLabel(self)
        self.error.setObjectName("Error")
        self.error.setWordWrap(True)
        self.error.hide()
        self.notice = QLabel(self)
        self.notice.setObjectName("Warning")
        self.notice.setWordWrap(True)
        self.notice.hide()
        self.composer = Composer(self)
        self.composer.thinking.setChecked(bool(settings.get("chat.thinking", True)))
        self.composer.send.connect(self.send)
        self.composer.stop.connect(self.stop)
        self.composer.settings_requested.connect(self.show_settings)
        self.composer.thinking_changed.connect(lambda on: self.settings.set("chat.thinking", on))

        lay = QVBoxLayout(self)
        lay.setContentsMargins(20, 16, 20, 12)
        lay.setSpacing(8)
        lay.addLayout(header)
        lay.addWidget(self.scroll, 1)
        lay.addWidget(self.notice)
        lay.addWidget(self.error)
        lay.addWidget(self.meter)
        lay.addWidget(self.composer)
        self._update_state()

    # -- store ----------------------------------------------------------------------------------------------------
    @property
    def store(self):
        """The history, opened on first use (after the first paint). If it cannot be opened, chats still work
        in a scratch history that is not kept, and the user is told why."""
        if self._store is None:
            from macapp.core.history import Store, StoreError

            try:
                self._store = Store.open()
                self._store.recover_interrupted()
            except StoreError as exc:
                self._store = self._scratch_store()
                self._tell_unsaved(f"{exc} Chats work but are not saved until Qwen Desk is restarted.")
        return self._store

    @staticmethod
    def _scratch_store():
        import tempfile
        from pathlib import Path

        from macapp.core.history import Store

        return Store.open(Path(tempfile.mkdtemp(prefix="qwen-desk-unsaved-")) / "history.sqlite3")

    def _tell_unsaved(self, text: str) -> None:
        self.unsaved = True
        self.unsaved_reason = text
        self.notice.setText(text)
        self.notice.show()
        self.history_notice.emit(text)

    def _writable_store(self):
        """The store to write this turn to. A read-only history (written by a newer app) is left untouched:
        the chat goes on in a scratch history that is not kept (the open conversation copied into it), told once."""
        store = self.store
        if not store.read_only:
            return store
        scratch = self._scratch_store()
        if self.conversation_id is not None:
            self.conversation_id = scratch.restore(store.get_conversation(self.conversation_id))
        self._read_only_store = store
        self._store = scratch
        self._tell_unsaved(
            "This chat is not being saved: the history is read-only (written by a newer Qwen Desk). "
            "Update Qwen Desk to keep new chats."
        )
        return scratch

    def conversation_rows(self) -> list[tuple[int, str]]:
        return [(c.id, c.display_title) for c in self.store.list_conversations(limit=200)]

    # -- model ----------------------------------------------------------------------------------------------------
    def _ensure_engine(self):
        if self.engine is None:
            from macapp.core.engine import Engine

            self.engine = Engine()
        return self.engine

    def load_model(self, ref: Any) -> None:
        """Load a ModelRef (with local_path) on the engine's worker thread; the window stays responsive."""
        if self.busy:
            self.stop()
        engine = self._ensure_engine()
        self.model_ref = None
        self.session = None
        self.title.setText(f"Loading {ref.name}…")
        self.model_changed.emit(f"Loading {ref.name}…")
        self.error.hide()
        self.load_job = engine.load(str(ref.local_path))
        bridge = EventBridge(parent=self)
        bridge.delivered.connect(lambda batch, r=ref: self._on_load_events(r, batch))
        bridge.attach(self.load_job)
        self._load_bridge = bridge
        self._update_state()

    def _on_load_events(self, ref: Any, batch: list[Any]) -> None:
        for ev in batch:
            kind = type(ev).__name__
            if kind == "Loaded":
                self.model_ref = ref
                self.model_info = ev
                self.load_job = None
                self.session = None
                self.composer.thinking.setEnabled(ev.has_thinking)
                label = f"{ref.name} · {ref.bits}-bit" if ref.bits else ref.name
                self.title.setText(label)
                self.model_changed.emit(f"Loaded {label}")
                self.needs_replay = bool(self.conversation_id)
                self._update_state()
                if ref.extra.get("load_anyway"):
                    self.meter.show_text(
                        "Loaded anyway: it may not fit the GPU budget — macOS may swap; replies can be slow or fail"
                    )
                self.model_ready.emit()
            elif kind == "Failed":
                self.load_job = None
                self.title.setText("No model loaded")
                self.model_changed.emit("No model loaded")
                self.show_error(f"Could not load {ref.name}: {ev.message}")
                self._update_state()

    def context_limit(self) -> int | None:
        session = self.session
        if session is not None and session.options.context_limit:
            return session.options.context_limit
        return self.model_info.max_context if self.model_info is not None else None

    def unload_model(self) -> None:
        """Free the model's memory (the conversation stays; loading a model again continues it)."""
        if self.engine is None or self.model_ref is None:
            return
        self._detach()
        job = self.engine.unload()
        self.model_ref = None
        self.model_info = None
        self.session = None
        self.needs_replay = self.conversation_id is not None
        self.title.setText("No model loaded")
        self.model_changed.emit("No model loaded")
        bridge = EventBridge(parent=self)
        bridge.delivered.connect(lambda _batch: self.meter.show_text("Model unloaded: its memory is free again"))
        bridge.attach(job)
        self._unload_bridge = bridge
        self._update_state()

    # -- conversation ---------------------------------------------------------------------------------------------
    def _clear_messages(self) -> None:
        while self.messages_layout.count() > 2:
            item = self.messages_layout.takeAt(1)
            if item.widget():
                item.widget().deleteLater()
        self.current = None

    def _message_widgets(self) -> list[QWidget]:
        return [
            self.messages_layout.itemAt(i).widget()
            for i in range(1, self.messages_layout.count() - 1)
            if self.messages_layout.itemAt(i).widget() is not None
        ]

    def _add_widget(self, widget: QWidget) -> QWidget:
        self.messages_layout.insertWidget(self.messages_layout.count() - 1, widget)
        self._update_state()
        return widget

    def new_chat(self) -> None:
        self._detach()
        self.conversation_id = None
        self.session = None
        self.needs_replay = False
        self.editing = False
        self._clear_messages()
        self.meter.clear_meter()
        self.error.hide()
        self.conversations_changed.emit()
        self._update_state()
        self.composer.input.setFocus()

    def open_conversation(self, conversation_id: int) -> None:
        """Show a saved conversation; the next message re-reads it once into a fresh engine session."""
        self._detach()
        conv = self.store.get_conversation(conversation_id)
        self._clear_messages()
        self.conversation_id = conv.id
        self.session = None
        self.needs_replay = True
        for m in conv.messages:
            if m.role == "user":
                self._add_widget(UserMessage(m.content, self.container)).position = m.position
            elif m.role == "assistant":
                w = AssistantMessage(self.container)
                w.position = m.position
                if m.reasoning:
                    w.add_reasoning(m.reasoning)
                w.add_answer(m.content)
                note = "stopped" if m.stopped else ""
                w.finish(m.stats if not m.stats.is_empty() else None, note)
                if w.reasoning is not None:
                    w.reasoning.header.setText("Thought")
                self._add_widget(w)
        self.meter.clear_meter()
        self.conversations_changed.emit()
        self._update_state()

    def _ensure_session(self):
        """A session for the current conversation; a reopened one is handed its history to re-read once."""
        if self.session is not None:
            return self.session
        from macapp.core.engine import SessionOptions

        system = self.settings.get("chat.system_prompt", "") or None
        history = None
        if self.conversation_id is not None and self.needs_replay:
            conv = self.store.get_conversation(self.conversation_id)
            system = conv.system_prompt or system
            history = [
                {"role": m.role, "content": m.content, "reasoning": m.reasoning}
                for m in conv.messages
                if m.role in ("user", "assistant")
            ]
        # The context and KV-cache bits chosen in the library are the ones the fit was computed for.
        limit = int(self.settings.get("library.context", 0) or 0) or None
        if limit and self.model_info is not None:
            limit = min(limit, self.model_info.max_context)
        options = SessionOptions(
            context_limit=limit,
            kv_bits=self.settings.get("library.kv_bits"),
            memory_budget_bytes=self.model_ref.extra.get("memory_budget_bytes"),  # set by "Load anyway"
        )
        self.session = self.engine.new_session(system_prompt=system, messages=history, options=options)
        self.needs_replay = False
        return self.session

    # -- generation -----------------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.job is not None

    @property
    def thinking(self) -> bool:
        return self.composer.thinking.isChecked()

    def _sampling(self):
        from macapp.core.sampling import preset

        values = sampling_for(self.settings, self.thinking)
        budget = values.pop("thinking_budget", None)
        params = preset(self.thinking).with_overrides(**{**values, **self.sampling_overrides})
        params.validate()
        return params, budget

    def _checked_sampling(self):
        """(params, budget), or None after showing why the settings cannot be used."""
        try:
            return self._sampling()
        except ValueError as exc:
            self.show_error(f"The chat settings cannot be used: {exc}. Fix them in Settings…, then send again.")
            return None

    def send(self, text: str) -> bool:
        """Send `text`; False (and the text back in the input box) when it could not be sent."""
        if self.busy or self.model_ref is None or not text.strip():
            return False
        self.error.hide()
        try:
            if self.editing:
                return self._do_edit(text)
            checked = self._checked_sampling()  # before anything is saved: bad settings lose nothing
            if checked is None:
                self.composer.input.setPlainText(text)
                return False
            sampling, budget = checked
            store = self._writable_store()
            if self.conversation_id is None:
                conv = store.create_conversation(
                    model=self.model_ref.name, system_prompt=self.settings.get("chat.system_prompt", "") or None
                )
                self.conversation_id = conv.id
            session = self._ensure_session()
            # The user's message is saved before generation starts: a crash never loses what they typed.
            self._add_user(text)
            self._start(session.send(text, thinking=self.thinking, sampling=sampling, thinking_budget=budget), "send", text)
        except Exception as exc:  # noqa: BLE001 - never raised into Qt's event loop; what was typed is kept
            self.composer.input.setPlainText(text)
            self.show_error(f"Could not send: {exc}")
            self._update_state()
            return False
        self.conversations_changed.emit()
        return True

    def _add_user(self, text: str) -> UserMessage:
        saved = self.store.add_message(self.conversation_id, "user", text)
        widget = UserMessage(text, self.container)
        widget.position = saved.position
        return self._add_widget(widget)

    def _start(self, job, kind: str, text: str = "", replacing: list[QWidget] | None = None) -> None:
        """Show the reply in flight. With `replacing` (regenerate, edit), the old turn stays in the history,
        hidden here, until the new reply is under way: a refused or failed turn puts it back."""
        self.current = self._add_widget(AssistantMessage(self.container))
        self._pending = None
        if replacing is None:
            self.writer = self.store.begin_reply(self.conversation_id, thinking=self.thinking, model=self.model_ref.name)
            self.current.position = self.writer.message.position
        else:
            self.writer = None
            new_user = None
            if kind == "edit":
                new_user = UserMessage(text, self.container)
                self.messages_layout.insertWidget(self.messages_layout.indexOf(self.current), new_user)
            for w in replacing:
                w.hide()
            self._pending = {"old": replacing, "user": new_user, "thinking": self.thinking}
        self._turn_kind, self._turn_text = kind, text
        self.job = job
        self._gen_started = time.monotonic()
        self.meter.show_text("Starting…")
        turn = {"job": job, "writer": self.writer, "detached": False}
        self._turn = turn
        bridge = EventBridge(interval_ms=self.repaint_interval_ms, parent=self)
        bridge.delivered.connect(lambda batch, t=turn: self._on_events(batch, t))
        self._gen_bridge = bridge
        bridge.attach(job)
        self._stick_to_bottom = True
        self._update_state()

    def _on_events(self, batch: list[Any], turn: dict | None = None) -> None:
        if turn is not None and turn["detached"]:
            self._finish_detached(batch, turn)
            return
        msg = self.current
        if msg is None:
            return
        for ev in batch:
            kind = type(ev).__name__
            if kind in ("ReasoningDelta", "AnswerDelta") and self._pending is not None:
                self._commit_pending()
            if kind == "ReasoningDelta":
                msg.add_reasoning(ev.text)
                self.writer.append(reasoning=ev.text)
            elif kind == "AnswerDelta":
                msg.add_answer(ev.text)
                self.writer.append(text=ev.text)
            elif kind == "PromptProgress":
                self.meter.show_progress(ev.processed, ev.total)
            elif kind == "StatsUpdate":
                msg.stats = ev.stats
                self.meter.show_stats(ev.stats)
            elif kind == "Finished":
                self._finish(getattr(ev, "reply", None))
                return
            elif kind == "Failed":
                self._finish(None, error=ev.message)
                return
        msg.render()
        self.renders += 1

    def _finish(self, reply: Any, error: str | None = None) -> None:
        msg = self.current
        kept = error is None and getattr(reply, "kept", True)
        if not kept:
            self._roll_back(error)
            return
        if self._pending is not None:
            self._commit_pending()
        stats = getattr(reply, "stats", None) or msg.stats
        reason = getattr(reply, "finish_reason", None)
        stopped = reason == "stopped"
        notes = {
            "stopped": "stopped",
            "length": "cut off at the max tokens limit",
            "context": "the context is full: start a new chat to go on",
        }
        note = notes.get(reason, "")
        if getattr(reply, "budget_hit", False):
            note = " · ".join(filter(None, [note, "thinking budget reached"]))
        msg.finish(stats, note)
        try:
            self.writer.finish(stats=stats, finish_reason=reason, stopped=stopped)
        except Exception as exc:  # noqa: BLE001 - a save failure is shown, never raised into Qt
            self.show_error(f"The reply could not be saved: {exc}")
        self.meter.show_context(stats, self.context_limit())
        self._end_turn()

    def _commit_pending(self) -> None:
        """The new reply is under way: now replace the old turn in the history (and save an edited message)."""
        pending, self._pending = self._pending, None
        old = pending["old"]
        if self.conversation_id is not None and old:
            self.store.truncate(self.conversation_id, old[0].position)
        for w in old:
            self.messages_layout.removeWidget(w)
            w.deleteLater()
        if pending["user"] is not None:
            saved = self.store.add_message(self.conversation_id, "user", self._turn_text)
            pending["user"].position = saved.position
        self.writer = self.store.begin_reply(self.conversation_id, thinking=pending["thinking"], model=self.model_ref.name)
        self.current.position = self.writer.message.position
        if self._turn is not None:
            self._turn["writer"] = self.writer

    def _detach(self) -> None:
        """Leave the reply in flight (New Chat, another conversation): stop it; it is saved when it ends."""
        turn = getattr(self, "_turn", None)
        if self.job is None or turn is None:
            return
        turn["detached"] = True
        turn["msg_position"] = self.current.position if self.current is not None else None
        self._pending = None  # a regenerate/edit not under way yet: the old turn stays in the history
        self.job.stop()
        self.current = None
        self.job = None
        self.writer = None
        self._update_state()

    def _finish_detached(self, batch: list[Any], turn: dict) -> None:
        writer = turn["writer"]
        if writer is None:  # it was detached before it got under way: nothing of it was saved
            return
        for ev in batch:
            kind = type(ev).__name__
            if kind == "ReasoningDelta":
                writer.append(reasoning=ev.text)
            elif kind == "AnswerDelta":
                writer.append(text=ev.text)
            elif kind in ("Finished", "Failed"):
                reply = getattr(ev, "reply", None)
                try:
                    writer.finish(stats=getattr(reply, "stats", None), finish_reason="stopped", stopped=True)
                    if reply is None or not reply.kept:  # nothing of the reply was kept by the engine
                        self.store.truncate(writer.message.conversation_id, writer.message.position)
                except Exception:  # noqa: BLE001 - best effort for a reply nobody is looking at
                    pass
                self.conversations_changed.emit()

    def _roll_back(self, error: str | None) -> None:
        """The engine kept nothing of this turn (stopped while reading, or refused): undo it here too."""
        if self._pending is not None:
            self._restore_pending(error)
            return
        widgets = self._message_widgets()
        first = len(widgets) - 1
        if self._turn_kind in ("send", "edit") and first > 0 and getattr(widgets[first - 1], "role", "") == "user":
            first -= 1
            self.composer.input.setPlainText(self._turn_text)  # what they typed is never lost
        if self.writer is not None:
            self.writer.finish(stopped=True)
        self._remove_from(first)
        if self._turn_kind != "send" or error:
            self.session = None  # the engine's view and ours may differ now: re-read from history next time
            self.needs_replay = True
        if error:
            self.show_error(error)
        self.meter.show_text("Stopped before the reply began" if not error else " ")
        self._end_turn()

    def _restore_pending(self, error: str | None) -> None:
        """A regenerate/edit that never got under way: show the old turn again (the history still has it)."""
        pending, self._pending = self._pending, None
        for w in (self.current, pending["user"]):
            if w is not None:
                self.messages_layout.removeWidget(w)
                w.deleteLater()
        for w in pending["old"]:
            w.show()
        if self._turn_kind == "edit":
            self.composer.input.setPlainText(self._turn_text)  # what they typed is never lost
        self.session = None  # re-read the conversation from the history next time
        self.needs_replay = True
        if error:
            self.show_error(error)
        self.meter.show_text("Stopped before the reply began; the previous reply is kept" if not error else " ")
        self._end_turn()

    def _end_turn(self) -> None:
        self.current = None
        self.job = None
        self.writer = None
        self._update_state()
        self.conversations_changed.emit()

    def stop(self) -> None:
        if self.job is not None:
            self.job.stop()

    def _last_index(self, role: str) -> int | None:
        widgets = self._message_widgets()
        for i in range(len(widgets) - 1, -1, -1):
            if getattr(widgets[i], "role", None) == role:
                return i
        return None

    def _remove_from(self, index: int) -> None:
        widgets = self._message_widgets()[index:]
        if not widgets:
            return
        if self.conversation_id is not None:
            self.store.truncate(self.conversation_id, widgets[0].position)
        for w in widgets:
            self.messages_layout.removeWidget(w)
            w.deleteLater()

    def regenerate(self) -> None:
        """Replace the last reply with a new one."""
        if self.busy or self.model_ref is None:
            return
        i = self._last_index("assistant")
        if i is None:
            return
        self.error.hide()
        checked = self._checked_sampling()
        if checked is None:
            return
        sampling, budget = checked
        try:
            self._writable_store()
            session = self._ensure_session()
            job = session.regenerate(thinking=self.thinking, sampling=sampling, thinking_budget=budget)
        except Exception as exc:  # noqa: BLE001 - shown, never raised into Qt
            self.show_error(f"Could not regenerate: {exc}")
            return
        self._start(job, "regenerate", replacing=self._message_widgets()[i:])

    def edit_last(self) -> None:
        """Put the last message back in the input box; sending replaces it and its reply."""
        if self.busy:
            return
        i = self._last_index("user")
        if i is None:
            return
        self.composer.input.setPlainText(self._message_widgets()[i].text)
        self.composer.input.setFocus()
        self.editing = True
        self.meter.show_text("Editing your last message — Send replaces it and its reply; Esc cancels")

    def _do_edit(self, text: str) -> bool:
        checked = self._checked_sampling()
        i = self._last_index("user")
        if checked is None or i is None:
            self.composer.input.setPlainText(text)
            return False
        sampling, budget = checked
        self._writable_store()
        session = self._ensure_session()
        job = session.edit_last(text, thinking=self.thinking, sampling=sampling, thinking_budget=budget)
        self.editing = False
        self._start(job, "edit", text, replacing=self._message_widgets()[i:])
        self.conversations_changed.emit()
        return True

    def cancel_edit(self) -> None:
        if self.editing:
            self.editing = False
            self.composer.input.clear()
            self.meter.clear_meter()

    # -- view state -----------------------------------------------------------------------------------------------
    def show_error(self, text: str) -> None:
        self.error.setText(text)
        self.error.show()

    def show_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self.thinking, self)
        self.settings_dialog = dialog
        dialog.open()

    def _update_state(self) -> None:
        loaded = self.model_ref is not None
        has_messages = bool(self._message_widgets())
        self.composer.set_busy(self.busy)
        if self.load_job is not None:
            self.composer.set_can_send(False, "Loading the model…")
        elif not loaded:
            self.composer.set_can_send(False, "Load a model from Models to start chatting")
        else:
            self.composer.set_can_send(True)
        self.empty.setVisible(not has_messages)
        if not loaded and self.load_job is None:
            self.empty.setText("No model loaded.\nPick one in Models (⌘1), download it, and press Load.")
        elif self.load_job is not None:
            self.empty.setText("Loading the model…")
        else:
            self.empty.setText("Ask anything.\nEnter sends · Shift+Enter adds a line · Esc stops")
        idle = loaded and not self.busy
        self.regenerate_button.setEnabled(idle and self._last_index("assistant") is not None)
        self.edit_button.setEnabled(idle and self._last_index("user") is not None)

    def _on_scrolled(self, value: int) -> None:
        bar = self.scroll.verticalScrollBar()
        self._stick_to_bottom = value >= bar.maximum() - 24

    def _follow(self, _lo: int, hi: int) -> None:
        if self._stick_to_bottom:
            self.scroll.verticalScrollBar().setValue(hi)

    def escape(self) -> None:
        """Esc: stop the reply in flight, else leave edit mode."""
        if self.busy:
            self.stop()
        else:
            self.cancel_edit()

    def shutdown(self) -> None:
        self.stop()
        if self.writer is not None:
            try:
                self.writer.finish(stopped=True)
            except Exception:  # noqa: BLE001
                pass
        if self.engine is not None and hasattr(self.engine, "close"):
            self.engine.close()
        for store in (self._store, self._read_only_store):
            if store is not None:
                store.close()
