"""The chat page: header, message list, meter, composer — laid out and wired to the ChatController."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from macapp.core.catalog import ModelRef
from macapp.core.events import Loaded, TurnKind
from macapp.core.history import Conversation
from macapp.core.recorder import TurnResult
from macapp.core.settings import Settings
from macapp.core.demo.model import SHORT_NOTICE, is_demo_model
from macapp.ui.chat_controller import ChatController, TurnEnd, TurnStart
from macapp.ui.composer import Composer
from macapp.ui.message_list import MessageList
from macapp.ui.messages import UserMessage
from macapp.ui.meter import Meter
from macapp.ui.model_bar import Choice, LoadPrompt, ModelPicker
from macapp.ui.pages import LIBRARY, key_text
from macapp.ui.settings import SettingsDialog
from macapp.ui.widgets import ElidedLabel


class ChatView(QWidget):
    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.controller = ChatController(settings, self)
        self.editing = False  # the composer holds the last message to replace
        self.settings_dialog: SettingsDialog | None = None

        self.title = ElidedLabel("No model loaded", self)
        self.title.setObjectName("PageTitle")
        self.regenerate_button = QPushButton("Regenerate", self)
        self.edit_button = QPushButton("Edit Last", self)
        self.new_button = QPushButton("New Chat", self)
        self.model_picker = ModelPicker(self)
        self.model_choices: list[Choice] = []
        header = QHBoxLayout()
        header.addWidget(self.title, 1)
        header.addWidget(self.model_picker)
        for b in (self.regenerate_button, self.edit_button, self.new_button):
            header.addWidget(b)
        self.messages = MessageList(self)
        self.meter = Meter(self)
        self.error = QLabel(self)
        self.error.setObjectName("Error")
        self.error.setWordWrap(True)
        self.error.hide()
        self.notice = QLabel(self)
        self.notice.setObjectName("Warning")
        self.notice.setWordWrap(True)
        self.notice.hide()
        self.demo_note = QLabel(self)
        self.demo_note.setObjectName("Warning")
        self.demo_note.setWordWrap(True)
        self.demo_note.hide()
        self.long_context_note = QLabel(self)  # the loaded model runs in long-context mode (YaRN): said while it does
        self.long_context_note.setObjectName("Warning")
        self.long_context_note.setWordWrap(True)
        self.long_context_note.hide()
        self.load_prompt = LoadPrompt(self)
        self.load_prompt.hide()
        self.composer = Composer(self)
        self.composer.thinking.setChecked(bool(settings.get("chat.thinking", True)))
        self.composer.attachments.video_model = self._model_folder

        lay = QVBoxLayout(self)
        lay.setContentsMargins(20, 16, 20, 12)
        lay.setSpacing(8)
        lay.addLayout(header)
        lay.addWidget(self.messages, 1)
        lay.addWidget(self.demo_note)
        lay.addWidget(self.long_context_note)
        lay.addWidget(self.notice)
        lay.addWidget(self.load_prompt)
        lay.addWidget(self.error)
        lay.addWidget(self.meter)
        lay.addWidget(self.composer)
        self._wire()
        self._update_state()

    def _wire(self) -> None:
        c = self.controller
        self.regenerate_button.clicked.connect(self.regenerate)
        self.edit_button.clicked.connect(self.edit_last)
        self.new_button.clicked.connect(self.new_chat)
        self.composer.send.connect(self.send)
        self.composer.stop.connect(c.stop)
        self.composer.settings_requested.connect(self.show_settings)
        self.composer.thinking_changed.connect(lambda on: self.settings.set("chat.thinking", on))
        self.messages.changed.connect(self._update_state)
        c.state_changed.connect(self._update_state)
        c.model_loaded.connect(self._on_model_loaded)
        c.turn_started.connect(self._on_turn_started)
        c.reply_under_way.connect(self.messages.replace_old_turn)
        c.reply_events.connect(self.messages.show_events)
        c.reply_events.connect(self.meter.show_events)
        c.turn_settled.connect(self._on_turn_settled)
        c.turn_left.connect(self.messages.leave_turn)
        c.conversation_updated.connect(lambda conv: self.messages.show_conversation(conv.messages))
        c.conversation_opened.connect(self._show_opened)
        c.give_back.connect(self.composer.input.setPlainText)  # what they typed is never lost
        c.status_text.connect(self.meter.show_text)
        c.error.connect(self.show_error)
        c.history_notice.connect(self._show_notice)
        c.tools.notice.connect(self._show_notice)  # an MCP server that failed to start
        c.tools.window = self  # the approval dialog's parent
        if c.tools.config_error:
            self._show_notice(c.tools.config_error)

    # -- actions --------------------------------------------------------------------------------------------------
    def _model_folder(self) -> Path | None:
        """The loaded model's folder: its processor decides a video's frames."""
        engine = self.controller.engine
        model = engine.model if engine is not None else None
        return model.path if model is not None else None

    @property
    def busy(self) -> bool:
        return self.controller.busy

    @property
    def thinking(self) -> bool:
        return self.composer.thinking.isChecked()

    def load_model(self, ref: ModelRef) -> None:
        self.error.hide()
        self.controller.load_model(ref)

    def unload_model(self) -> None:
        self.controller.unload_model()

    def send(self, text: str) -> bool:
        """Send `text` (or, after Edit Last, replace the last message with it); False, with the text back in
        the input box, when it could not be sent."""
        if self.busy or not text.strip():
            return False
        if self.composer.attachments.pending:  # a picture still being read goes with this message: wait for it
            self.composer.input.setPlainText(text)
            return False
        self.error.hide()
        if self.editing and self.messages.last_index("user") is not None:
            started = self.controller.edit(text, self.thinking)  # the message keeps its pictures
        else:
            started = self.controller.send(text, self.thinking, self.composer.attachments.pictures())
        if started:
            if not self.editing:
                self.composer.attachments.clear()  # they went with the message
            self.editing = False
        else:
            self.composer.input.setPlainText(text)  # what they typed is never lost
        return started

    def regenerate(self) -> None:
        """Replace the last reply with a new one."""
        if self.busy or self.messages.last_index("assistant") is None:
            return
        self.error.hide()
        self.controller.regenerate(self.thinking)

    def edit_last(self) -> None:
        """Put the last message back in the input box; sending replaces it and its reply."""
        i = self.messages.last_index("user")
        if self.busy or i is None:
            return
        message = self.messages.widgets()[i]
        if not isinstance(message, UserMessage):  # never: last_index("user") finds a user message
            return
        self.composer.input.setPlainText(message.text)
        self.composer.input.setFocus()
        self.editing = True
        self.meter.show_text("Editing your last message — Send replaces it and its reply; Esc cancels")

    def cancel_edit(self) -> None:
        if self.editing:
            self.editing = False
            self.composer.input.clear()
            self.meter.clear_meter()

    def stop(self) -> None:
        self.controller.stop()

    def escape(self) -> None:
        """Esc: stop the reply in flight, else leave edit mode."""
        if self.busy:
            self.controller.stop()
        else:
            self.cancel_edit()

    def new_chat(self) -> None:
        self.controller.new_chat()
        self.editing = False
        self.messages.clear()
        self.meter.clear_meter()
        self.error.hide()
        self.composer.input.setFocus()

    def open_conversation(self, conversation_id: int) -> None:
        """Show a saved conversation once it is read (off the GUI thread: _show_opened); the next message re-reads
        it once into a fresh engine session."""
        self.controller.open_conversation(conversation_id)

    def _show_opened(self, conv: Conversation) -> None:
        self.editing = False
        self.messages.show_conversation(conv.messages)
        self.meter.clear_meter()

    def show_settings(self) -> None:
        self.settings_dialog = SettingsDialog(self.settings, self.thinking, self)
        self.settings_dialog.open()

    def shutdown(self) -> None:
        self.controller.shutdown()

    # -- what the controller says ---------------------------------------------------------------------------------
    def show_error(self, text: str) -> None:
        self.error.setText(text)
        self.error.show()

    def _show_notice(self, text: str) -> None:
        self.notice.setText(text)
        self.notice.show()

    def set_model_choices(self, choices: list[Choice]) -> None:
        """The models on this machine (the library's rows on disk), for the picker and the load prompt."""
        self.model_choices = list(choices)
        self._update_state()

    def conversation_model(self) -> str | None:
        """The model the open conversation was written with (None for a new chat)."""
        c = self.controller
        return (c.recorder.model or None) if c.recorder is not None and c.conversation_id is not None else None

    def _update_model_controls(self, loaded: bool, loading: bool) -> None:
        ref = self.controller.model_ref
        path = ref.local_path if loaded and ref is not None else None  # loaded: the controller has a model_ref
        self.model_picker.set_choices(self.model_choices, path)
        if loaded or loading:
            self.load_prompt.hide()
        else:
            name = self.conversation_model()
            own = next((c for c in self.model_choices if name and c.name == name), None)
            self.load_prompt.show_for(name, own)
        self.demo_note.setText(SHORT_NOTICE + " (download a real model in Models for real answers)")
        self.demo_note.setVisible(loaded and is_demo_model(path))
        said = self.controller.long_context_notice() if loaded else None
        self.long_context_note.setText(said[0].upper() + said[1:] if said else "")
        self.long_context_note.setVisible(bool(said))

    def _on_model_loaded(self, loaded: Loaded) -> None:
        self.composer.thinking.setEnabled(loaded.has_thinking)

    def _on_turn_started(self, start: TurnStart) -> None:
        self.messages.begin_turn(start)

    def _on_turn_settled(self, end: TurnEnd) -> None:
        self.messages.settle(end)
        outcome = end.outcome
        if outcome.give_back is not None:
            self.composer.input.setPlainText(outcome.give_back)  # what they typed is never lost
        if outcome.error is not None:
            self.meter.clear_meter()
        elif outcome.result is TurnResult.UNDONE:
            kept = "; the previous reply is kept" if outcome.kind is not TurnKind.SEND else ""
            self.meter.show_text(f"Stopped before the reply began{kept}")
        elif end.reply is not None:
            self.meter.show_context(end.reply.stats, end.context_limit)

    def _update_state(self) -> None:
        c = self.controller
        loaded = c.model_ref is not None
        loading = c.load_job is not None
        if loading:
            self.title.setText(f"Loading {c.loading_name}…")
        else:
            self.title.setText(c.model_label or "No model loaded")
        self.composer.set_busy(c.busy)
        if loading:
            self.composer.set_can_send(False, "Loading the model…")
            self.messages.set_empty_text("Loading the model…")
        elif not loaded:
            self.composer.set_can_send(False, "Load a model from Models to start chatting")
            self.messages.set_empty_text(f"No model loaded.\nPick one in Models ({key_text(LIBRARY)}), download it, and press Load.")
        else:
            self.composer.set_can_send(True)
            self.messages.set_empty_text("Ask anything.\nEnter sends · Shift+Enter adds a line · Esc stops")
        self._update_model_controls(loaded, loading)
        idle = loaded and not c.busy
        self.regenerate_button.setEnabled(idle and self.messages.last_index("assistant") is not None)
        self.edit_button.setEnabled(idle and self.messages.last_index("user") is not None)
