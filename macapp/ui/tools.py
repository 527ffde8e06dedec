"""MCP tools in the window (macapp.core.tools): the approval dialog, a tool call's collapsible block in a reply,
the Tools pane, and WindowTools, which owns the servers for the app's run and asks the user on the GUI thread.

The tool loop runs on a thread of its own and blocks in `WindowTools.ask` until the user answers the dialog (or the
turn is stopped: then the call is denied). The dialog shows the server, the tool and the full arguments as
formatted JSON in a scrollable box, with Allow once / Always allow this tool / Deny.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from macapp.core.events import ToolCallAsked, ToolCallRecord
from macapp.core.recorder import run_on
from macapp.core.tools.approvals import Approvals, Decision, approvals_path
from macapp.core.tools.config import ConfigError, config_path, read_config
from macapp.core.tools.host import McpHost
from macapp.core.tools.loop import ApprovalRequest, ToolLoop, ToolPolicy
from macapp.core.conversation import TurnRunner
from macapp.ui.widgets import CollapsibleFrame

log = logging.getLogger(__name__)

RIGHTS_NOTE = (
    "MCP servers are programs that run with your user's rights: they can read and change whatever you can. "
    "Add only servers you trust; every call is shown to you before it runs unless you chose “Always allow”."
)
BODY_LINES = 14  # a call's block shows this many lines of arguments and result, then scrolls
CANCEL_POLL_S = 0.1  # how often a waiting approval looks whether the turn was stopped


def _mono(widget: QWidget) -> None:
    widget.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))


def _json(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


class ApprovalDialog(QDialog):
    """Run this tool? The server, the tool, its description and the full arguments; three answers."""

    def __init__(self, request: ApprovalRequest, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.request = request
        self.decision = Decision.DENY  # closing the dialog denies
        self.setWindowTitle("Run a tool?")
        self.setObjectName("ApprovalDialog")
        lay = QVBoxLayout(self)
        self.title = QLabel(f"The model wants to run <b>{request.tool}</b> from the MCP server <b>{request.server}</b>.", self)
        self.title.setWordWrap(True)
        lay.addWidget(self.title)
        if request.description:
            about = QLabel(request.description, self)
            about.setObjectName("Note")
            about.setWordWrap(True)
            lay.addWidget(about)
        lay.addWidget(QLabel("With these arguments:", self))
        self.arguments = QPlainTextEdit(request.arguments_json, self)
        self.arguments.setReadOnly(True)
        self.arguments.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        _mono(self.arguments)
        self.arguments.setMinimumSize(460, 160)
        lay.addWidget(self.arguments, 1)
        note = QLabel(RIGHTS_NOTE, self)
        note.setObjectName("Note")
        note.setWordWrap(True)
        lay.addWidget(note)
        buttons = QHBoxLayout()
        self.deny_button = QPushButton("Deny", self)
        self.always_button = QPushButton("Always allow this tool", self)
        self.once_button = QPushButton("Allow once", self)
        self.once_button.setDefault(True)
        buttons.addWidget(self.deny_button)
        buttons.addStretch(1)
        buttons.addWidget(self.always_button)
        buttons.addWidget(self.once_button)
        lay.addLayout(buttons)
        self.deny_button.clicked.connect(lambda: self._answer(Decision.DENY))
        self.always_button.clicked.connect(lambda: self._answer(Decision.ALWAYS))
        self.once_button.clicked.connect(lambda: self._answer(Decision.ALLOW_ONCE))

    def _answer(self, decision: Decision) -> None:
        self.decision = decision
        self.done(QDialog.DialogCode.Rejected if decision is Decision.DENY else QDialog.DialogCode.Accepted)


def call_state(record: ToolCallRecord | None) -> str:
    if record is None:
        return "waiting for your approval…"
    if not record.allowed:
        return "denied" if record.result is None else (record.result or "not run")
    if record.timed_out:
        return f"timed out after {record.elapsed_s:.0f} s"
    return f"{'failed' if record.is_error else 'done'} in {record.elapsed_s:.2f} s"


class ToolCallBlock(CollapsibleFrame):
    """One call in a reply: a header (tool, state, time) that folds out the arguments and the result."""

    body: QPlainTextEdit

    def __init__(self, server: str, name: str, arguments: dict[str, object], parent: QWidget | None = None, call_id: str = "") -> None:
        super().__init__("ToolCallBox", parent)
        self.call_id = call_id
        self.server, self.name, self.arguments = server, name, arguments
        self.record: ToolCallRecord | None = None
        self.body = QPlainTextEdit(self)
        self.body.setReadOnly(True)
        self.body.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # long lines wrap
        _mono(self.body)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.header, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(self.body)
        self._show()
        self.set_expanded(False)

    @classmethod
    def of(cls, record: ToolCallRecord, parent: QWidget | None = None) -> ToolCallBlock:
        block = cls(record.server, record.name, record.arguments, parent, record.call_id)
        block.finish(record)
        return block

    def finish(self, record: ToolCallRecord) -> None:
        self.record = record
        self._show()

    def _show(self) -> None:
        where = f"{self.server}/{self.name}" if self.server else self.name
        self.header.setText(f"Tool {where} · {call_state(self.record)}")
        text = f"Arguments:\n{_json(self.arguments)}"
        if self.record is not None and self.record.result is not None:
            text += f"\n\nResult:\n{self.record.result}"
        self.body.setPlainText(text)
        lines = min(text.count("\n") + 1, BODY_LINES)  # as tall as the text, up to BODY_LINES (then it scrolls)
        margins = 2 * (self.body.frameWidth() + int(self.body.document().documentMargin())) + 8
        self.body.setFixedHeight(self.body.fontMetrics().lineSpacing() * (lines + 1) + margins)


@dataclass
class _Asking:
    request: ApprovalRequest
    answered: threading.Event = field(default_factory=threading.Event)
    decision: Decision = Decision.DENY


class WindowTools(QObject):
    """The window's MCP servers (mcp.json in the app's folder), their tool loop and the user's approvals."""

    approval_shown = Signal(object)  # the ApprovalDialog now open
    notice = Signal(str)  # a server that failed to start, a malformed config: one clear sentence
    changed = Signal()  # a server's state or the remembered approvals changed
    _ask = Signal(object)  # an _Asking, from the loop's thread
    _withdraw = Signal(object)  # its ApprovalRequest: the turn was stopped while asking (from the loop's thread)
    _changed_elsewhere = Signal()

    def __init__(self, parent: QObject | None = None, window: QWidget | None = None) -> None:
        super().__init__(parent)
        self.window = window
        self.approvals = Approvals(approvals_path())
        self.config_error: str | None = None
        self.dialog: ApprovalDialog | None = None
        try:
            servers = read_config()
        except ConfigError as exc:
            self.config_error, servers = str(exc), []
        self.host = McpHost(servers) if servers else None
        self.loop: ToolLoop | None = None
        if self.host is not None:
            self.loop = ToolLoop(self.host, ToolPolicy(self.approvals, ask=self.ask), warn=self.notice.emit)
            self.host.add_listener(self._changed_elsewhere.emit)
        self._ask.connect(self._show_dialog, Qt.ConnectionType.QueuedConnection)
        self._withdraw.connect(self._close_dialog, Qt.ConnectionType.QueuedConnection)
        self._changed_elsewhere.connect(self.changed, Qt.ConnectionType.QueuedConnection)

    @property
    def run_turn(self) -> TurnRunner:
        """What runs a chat turn: the tool loop when servers are configured, else the session alone."""
        return self.loop.run if self.loop is not None else run_on

    def ask(self, request: ApprovalRequest) -> Decision:
        """The loop's thread: show the dialog on the GUI thread and wait for the answer (a stopped turn: deny)."""
        asking = _Asking(request)
        self._ask.emit(asking)
        while not asking.answered.wait(CANCEL_POLL_S):
            if request.cancelled.is_set():
                self._withdraw.emit(request)
                return Decision.DENY
        return asking.decision

    def _close_dialog(self, request: ApprovalRequest) -> None:
        if self.dialog is not None and self.dialog.request is request:
            self.dialog.reject()  # denied: the turn is over

    def _show_dialog(self, asking: _Asking) -> None:
        if asking.request.cancelled.is_set():
            asking.answered.set()
            return
        dialog = ApprovalDialog(asking.request, self.window)

        def answered(_code: int) -> None:
            asking.decision = dialog.decision
            asking.answered.set()
            self.dialog = None
            if dialog.decision is Decision.ALWAYS:
                self.changed.emit()
            dialog.deleteLater()

        dialog.finished.connect(answered)
        self.dialog = dialog
        dialog.open()
        self.approval_shown.emit(dialog)

    def revoke(self, server: str, tool: str) -> None:
        self.approvals.revoke(server, tool)
        self.changed.emit()

    def close(self) -> None:
        if self.host is not None:
            self.host.close()


class ToolsPane(QDialog):
    """The servers (state, what runs, their tools), the tools allowed without asking (revocable), and the note
    that servers run with the user's rights."""

    def __init__(self, tools: WindowTools, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tools = tools
        self.setWindowTitle("Tools (MCP servers)")
        self.resize(620, 480)
        lay = QVBoxLayout(self)
        note = QLabel(RIGHTS_NOTE, self)
        note.setWordWrap(True)
        lay.addWidget(note)
        self.where = QLabel(self)
        self.where.setObjectName("Note")
        self.where.setWordWrap(True)
        self.where.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.where)
        self.servers = QTreeWidget(self)
        self.servers.setHeaderLabels(["Server / tool", "State", "Runs"])
        lay.addWidget(self.servers, 2)
        lay.addWidget(QLabel("Allowed without asking (“Always allow”):", self))
        self.allowed = QTreeWidget(self)
        self.allowed.setHeaderLabels(["Server", "Tool", ""])
        lay.addWidget(self.allowed, 1)
        close = QPushButton("Close", self)
        close.clicked.connect(self.accept)
        lay.addWidget(close, 0, Qt.AlignmentFlag.AlignRight)
        tools.changed.connect(self.refresh)
        self.refresh()

    def refresh(self) -> None:
        tools = self.tools
        where = f"Servers are read from {config_path()} (docs/tools.md says how to add one)."
        self.where.setText(f"{tools.config_error}\n{where}" if tools.config_error else where)
        self.servers.clear()
        for status in tools.host.servers() if tools.host is not None else []:
            item = QTreeWidgetItem([status.config.name, str(status.state) + (f": {status.error}" if status.error else ""), status.config.describe()])
            for offered in status.tools:
                item.addChild(QTreeWidgetItem([offered.offered, "", offered.description]))
            self.servers.addTopLevelItem(item)
            item.setExpanded(True)
        if not self.servers.topLevelItemCount():
            self.servers.addTopLevelItem(QTreeWidgetItem(["(no servers configured)", "", ""]))
        self.allowed.clear()
        for server, name in tools.approvals.remembered():
            row = QTreeWidgetItem([server, name, ""])
            self.allowed.addTopLevelItem(row)
            button = QPushButton("Revoke", self.allowed)
            button.clicked.connect(lambda _=False, s=server, t=name: self.tools.revoke(s, t))
            self.allowed.setItemWidget(row, 2, button)


def asked_block(event: ToolCallAsked, parent: QWidget | None = None) -> ToolCallBlock:
    return ToolCallBlock(event.server, event.name, event.arguments, parent, event.call_id)
