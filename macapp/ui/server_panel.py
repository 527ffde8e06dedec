"""The Local Server page: start/stop the OpenAI- and Anthropic-compatible API on the loaded model, its base URL,
the settings other tools need (copied to the clipboard), and a live list of the server's requests.

`ServerController` (a QObject) owns the server: uvicorn runs on its own thread (macapp.server.local_server), and
starting it happens on a helper thread too, so the event loop never waits on a socket. The request records
come from the server's Activity on the engine's worker thread and reach the view as queued signals. Server
requests never touch the chat history.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from macapp.core.secrets import KeyRejected, KeyStore
from macapp.server.activity import Activity, RequestRecord, RequestState
from macapp.server.client_settings import client_settings
from macapp.server.config import DEFAULT_PORT, ServerConfig

if TYPE_CHECKING:  # both import mlx-lm: only once the server starts
    from macapp.core.serving.runner import ServingEngine
    from macapp.server.local_server import LocalServer

COLUMNS = ("Client", "Tokens in", "Reused", "Out", "tok/s", "State")
SPEED_COLUMN = COLUMNS.index("tok/s")
STATE_TEXT = {
    RequestState.WAITING: "waiting for the engine",
    RequestState.READING: "reading the prompt",
    RequestState.ANSWERING: "answering",
    RequestState.DONE: "done",
    RequestState.STOPPED: "stopped",
    RequestState.FAILED: "failed",
    RequestState.REFUSED: "refused",
}


PORT_IN_USE_ERRNOS = (48, 98)  # EADDRINUSE on macOS, Linux


def start_failure_text(exc: OSError, port: int) -> str:
    """Why the server did not start, in the window's words (the server's own message names the --port flag)."""
    cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
    if cause.errno in PORT_IN_USE_ERRNOS:
        return f"Port {port} is already in use by another program: choose another port here and press Start again."
    return str(exc)


class ServerController(QObject):
    """Starts and stops the local server on the engine the chat uses; says what it does through signals."""

    started = Signal(str)  # base URL
    stopped = Signal()
    failed = Signal(str)  # why it could not start
    request_updated = Signal(object)  # RequestRecord
    busy_changed = Signal(bool)  # a server request is in flight (the chat's replies wait meanwhile)

    def __init__(self, backend_factory: Callable[[], ServingEngine], parent: QObject | None = None) -> None:
        """`backend_factory()` makes the server's Backend on the loaded model (raises RuntimeError if none)."""
        super().__init__(parent)
        self.backend_factory = backend_factory
        self.activity = Activity()
        self.activity.add_observer(self.request_updated.emit)  # from the worker: a queued signal
        self.request_updated.connect(self._track_busy)
        self.server: LocalServer | None = None
        self.backend: ServingEngine | None = None
        self.model_name = ""
        self._busy = False
        self._starting = False

    @property
    def running(self) -> bool:
        return self.server is not None and self.server.running

    @property
    def busy(self) -> bool:
        return self._busy

    def start(self, port: int, api_key: str | None = None) -> None:
        """Start serving on 127.0.0.1:port; `started` or `failed` follows (from a helper thread, queued)."""
        if self.running or self._starting:
            return
        try:
            backend = self.backend_factory()
        except RuntimeError as exc:
            self.failed.emit(str(exc))
            return
        from macapp.server.local_server import LocalServer  # why: it imports mlx-lm (the API's bounds), not wanted before the window paints

        config = ServerConfig(port=port, api_key=api_key or None)
        server = LocalServer(backend, config, self.activity)
        self._starting = True

        def bind() -> None:
            try:
                url = server.start()
            except OSError as exc:
                self._starting = False
                backend.close()
                self.failed.emit(start_failure_text(exc, port))
                return
            self.server, self.backend, self.model_name = server, backend, backend.model_name
            self._starting = False
            self.started.emit(url)

        threading.Thread(target=bind, name="qwen-desk-server-start", daemon=True).start()

    def stop(self, wait: bool = False) -> None:
        """Stop every request in flight (their replies end as stopped), then the server; `stopped` follows.
        Off the GUI thread unless `wait` (the window closing), since the last replies get a moment to finish."""
        server, backend, self.server, self.backend = self.server, self.backend, None, None
        if server is None:
            return

        def down() -> None:
            server.stop()
            if backend is not None:
                backend.close()
            self.stopped.emit()

        if wait:
            down()
        else:
            threading.Thread(target=down, name="qwen-desk-server-stop", daemon=True).start()

    def settings_text(self) -> str:
        server = self.server
        if server is None or not self.running:
            return ""
        return client_settings(server.base_url, server.config.api_key, self.model_name)

    @Slot(object)
    def _track_busy(self, _record: RequestRecord) -> None:
        busy = self.activity.busy()
        if busy != self._busy:
            self._busy = busy
            self.busy_changed.emit(busy)


class ServerPanel(QWidget):
    """A thin view over a ServerController."""

    def __init__(self, controller: ServerController, parent: QWidget | None = None, keys: KeyStore | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.keys = keys if keys is not None else KeyStore.default()
        self._key_note = ""  # why the key was not remembered, shown beside the server's state
        title = QLabel("Local Server", self)
        title.setObjectName("PageTitle")  # a page like Models and Chat
        note = QLabel(
            "Serve the loaded model to other tools: OpenAI-compatible (/v1/chat/completions) and "
            "Anthropic-compatible (/v1/messages, for Claude Code). Only this Mac can reach it.",
            self,
        )
        note.setWordWrap(True)
        note.setObjectName("Note")
        self.port = QSpinBox(self)
        self.port.setRange(1024, 65535)
        self.port.setValue(DEFAULT_PORT)
        self.api_key = QLineEdit(self)
        self.api_key.setPlaceholderText("API key (optional)")
        self.api_key.setEchoMode(QLineEdit.EchoMode.PasswordEchoOnEdit)
        self.api_key.setMaximumWidth(320)
        self.remember = QCheckBox("Remember key", self)
        self.remember.setToolTip("Keep the key for next time: in the keychain on macOS, else in a file only you can read")
        remembered = self.keys.load()
        if remembered:
            self.api_key.setText(remembered)
            self.remember.setChecked(True)
        self.remember.toggled.connect(self._remember_toggled)
        self.toggle = QPushButton("Start", self)
        self.toggle.clicked.connect(self._toggle)
        self.url = QLabel("Not running", self)
        self.url.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.copy = QPushButton("Copy Settings for Other Tools", self)
        self.copy.setToolTip("OpenAI base URL, and the env block for Claude Code's ~/.claude/settings.json")
        self.copy.clicked.connect(self.copy_settings)
        self.message = QLabel("", self)
        self.message.setWordWrap(True)
        self.table = QTableWidget(0, len(COLUMNS), self)
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.ResizeMode.Stretch)  # the state, with its error
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self.table.setShowGrid(False)
        for column in range(1, len(COLUMNS) - 1):  # the figures, right-aligned under their headings
            item = self.table.horizontalHeaderItem(column)
            if item is not None:  # set just above, from the column labels
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self._rows: dict[int, int] = {}  # record id -> row

        controls = QHBoxLayout()
        controls.addWidget(QLabel("Port", self))
        controls.addWidget(self.port)
        controls.addWidget(self.api_key, 1)
        controls.addWidget(self.remember)
        controls.addWidget(self.toggle)
        controls.addStretch(0)
        address = QHBoxLayout()
        address.addWidget(self.url, 1)
        address.addWidget(self.copy)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(20, 16, 20, 12)  # as the Models page
        for widget in (title, note):
            lay.addWidget(widget)
        lay.addLayout(controls)
        lay.addLayout(address)
        lay.addWidget(self.message)
        lay.addWidget(self.table, 1)

        controller.started.connect(self._on_started)
        controller.stopped.connect(self._on_stopped)
        controller.failed.connect(self._on_failed)
        controller.request_updated.connect(self.show_record)
        self._on_stopped()

    def _toggle(self) -> None:
        if self.controller.running:
            self.toggle.setEnabled(False)
            self.message.setText("Stopping…")
            self.controller.stop()
            return
        self.toggle.setEnabled(False)
        self.message.setText("Starting…")
        self.keep_key()
        if self._key_note:
            self.message.setText(f"Starting… {self._key_note}")
        self.controller.start(self.port.value(), self.api_key.text().strip() or None)

    def keep_key(self) -> None:
        """Remember the key as it is now (Remember key on), or forget the one kept (off, or the field emptied)."""
        key = self.api_key.text().strip()
        self._key_note = ""
        try:
            if self.remember.isChecked() and key:
                place = self.keys.save(key)
                self.remember.setToolTip(f"The key is kept in {place.value}.")
            else:
                self.keys.forget()
        except (KeyRejected, OSError) as exc:
            self._key_note = f"The key was not remembered: {exc}"
            self.message.setText(self._key_note)

    def _remember_toggled(self, _checked: bool) -> None:
        self.keep_key()

    def copy_settings(self) -> str:
        text = self.controller.settings_text()
        if text:
            QGuiApplication.clipboard().setText(text)
            self.message.setText("Copied: the OpenAI base URL, and the env block for ~/.claude/settings.json.")
        return text

    @Slot(str)
    def _on_started(self, url: str) -> None:
        self.toggle.setText("Stop")
        self.toggle.setEnabled(True)
        self.port.setEnabled(False)
        self.api_key.setEnabled(False)
        self.remember.setEnabled(False)
        self.copy.setEnabled(True)
        self.url.setText(f"Base URL <b>{url}</b> · OpenAI clients: <b>{url}/v1</b> · Claude Code: the base URL")
        self.message.setText(f"Serving {self.controller.model_name}." + (f" {self._key_note}" if self._key_note else ""))

    @Slot()
    def _on_stopped(self) -> None:
        self.toggle.setText("Start")
        self.toggle.setEnabled(True)
        self.port.setEnabled(True)
        self.api_key.setEnabled(True)
        self.remember.setEnabled(True)
        self.copy.setEnabled(False)
        self.url.setText("Not running")
        if self.message.text() == "Stopping…":
            self.message.setText("Stopped.")

    @Slot(str)
    def _on_failed(self, reason: str) -> None:
        self._on_stopped()
        self.message.setText(f"Could not start the server: {reason}")

    @Slot(object)
    def show_record(self, record: RequestRecord) -> None:
        row = self._rows.get(record.id)
        if row is None:
            row = self.table.rowCount()
            self.table.insertRow(row)
            self._rows[record.id] = row
        state = STATE_TEXT[record.state] + (f" {record.status}" if record.status else "") + (f": {record.error}" if record.error else "")
        values = (
            record.client,
            record.prompt_tokens,
            record.cached_tokens,
            record.completion_tokens,
            f"{record.tokens_per_s:.1f}" if record.tokens_per_s else "",
            state,
        )
        for column, value in enumerate(values):
            item = QTableWidgetItem(str(value))
            if column == SPEED_COLUMN and record.mtp_tokens_per_step is not None and record.mtp_acceptance is not None:
                item.setToolTip(f"MTP: {record.mtp_tokens_per_step:.2f} tokens per verify pass, {record.mtp_acceptance:.0%} of drafts kept")
            if 0 < column < len(COLUMNS) - 1:  # the figures
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(row, column, item)
