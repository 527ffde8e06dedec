"""The main window: sidebar (Models, chats), the library and chat pages, menus, status bar; persists its state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMenu,
    QMessageBox,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from macapp import APP_NAME, __version__
from macapp.core.events import Event, Failed
from macapp.core.history import Conversation
from macapp.core.jsonvalue import JSONValue
from macapp.core.settings import Settings
from macapp.core.demo.model import DemoReady, build_job
from macapp.ui.tools import ToolsPane
from macapp.ui.bridge import EventBridge
from macapp.ui.chat_controller import EditKind, HistoryEdit
from macapp.ui.chat_history import ConversationSearch
from macapp.ui.chat_view import ChatView
from macapp.ui.library import LibraryPage
from macapp.ui.model_bar import Choice
from macapp.ui.pages import CHAT, KEYS, LIBRARY, SERVER, TITLES
from macapp.ui.server_panel import ServerController, ServerPanel
from macapp.ui.settings import int_setting
from macapp.ui.status import StatusArea

if TYPE_CHECKING:  # the engine's job and the server's backend: for their types only (the backend imports MLX)
    from macapp.core.engine.jobs import Job
    from macapp.core.serving.runner import ServingEngine

TITLE_CHARS = 22  # a conversation title this long shows whole in the sidebar
ITEM_PADDING = 2 * 8 + 2 * 6  # the list items' padding (style.qss) and the search field's frame, with some air


class Sidebar(QWidget):
    page_requested = Signal(int)
    new_chat_requested = Signal()
    conversation_selected = Signal(object)
    delete_requested = Signal(object)
    rename_requested = Signal(object)
    search_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Sidebar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.nav = QListWidget(self)
        self.nav.setObjectName("NavList")
        for text in TITLES:  # the page titles and the View menu say the same
            self.nav.addItem(QListWidgetItem(text))
        self.nav.setFixedHeight(self.nav.sizeHintForRow(0) * self.nav.count() + 12)
        for policy in (self.nav.setVerticalScrollBarPolicy, self.nav.setHorizontalScrollBarPolicy):
            policy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # three fixed rows: a scroll bar (off by a pixel) only hid text
        self.nav.currentRowChanged.connect(self.page_requested)
        self.new_chat = QPushButton("New Chat", self)
        self.new_chat.clicked.connect(self.new_chat_requested)
        title = QLabel("Conversations", self)
        title.setObjectName("SectionTitle")
        self.search = QLineEdit(self)
        self.search.setObjectName("Search")
        self.search.setPlaceholderText("Search messages")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(lambda text: self.search_changed.emit(text.strip()))
        self.conversations = QListWidget(self)
        self.conversations.setObjectName("ConversationList")
        self.conversations.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conversations.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.conversations.setWordWrap(False)
        self.conversations.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.conversations.customContextMenuRequested.connect(self._conversation_menu)
        self.conversations.itemClicked.connect(lambda item: self.conversation_selected.emit(item.data(Qt.ItemDataRole.UserRole)))
        self.empty_note = QLabel("No conversations yet", self)
        self.empty_note.setObjectName("Note")
        self.empty_note.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 10, 8, 8)
        lay.setSpacing(4)
        lay.addWidget(self.nav)
        lay.addWidget(title)
        lay.addWidget(self.search)
        lay.addWidget(self.conversations, 1)
        lay.addWidget(self.empty_note)
        lay.addWidget(self.new_chat)
        self.setFixedWidth(self.fitting_width())

    def fitting_width(self) -> int:
        """One width on every page (the splitter otherwise gives the sidebar what each page leaves): the widest of
        its own words, and room for a conversation title of TITLE_CHARS characters."""
        fm = self.fontMetrics()
        words = [*TITLES, "Conversations", self.search.placeholderText(), self.empty_note.text(), self.new_chat.text()]
        text = max([fm.horizontalAdvance(w) for w in words] + [fm.averageCharWidth() * TITLE_CHARS])
        lay = self.layout()
        sides = lay.contentsMargins().left() + lay.contentsMargins().right() if lay is not None else 0
        return text + ITEM_PADDING + sides

    def _conversation_menu(self, pos: QPoint) -> None:
        item = self.conversations.itemAt(pos)
        if item is None:
            return
        key = item.data(Qt.ItemDataRole.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename_requested.emit(key))
        menu.addAction("Delete", lambda: self.delete_requested.emit(key))
        menu.exec(self.conversations.viewport().mapToGlobal(pos))

    def set_conversations(self, rows: Sequence[tuple[object, str]], current: object = None, empty: str = "No conversations yet") -> None:
        self.conversations.blockSignals(True)
        self.conversations.clear()
        for key, title in rows:
            item = QListWidgetItem(title or "Untitled")
            item.setData(Qt.ItemDataRole.UserRole, key)
            item.setToolTip(title)
            self.conversations.addItem(item)
            if key == current:
                self.conversations.setCurrentItem(item)
        self.conversations.blockSignals(False)
        self.empty_note.setText(empty)
        self.empty_note.setVisible(not rows)


class MainWindow(QMainWindow):
    def __init__(self, settings: Settings | None = None) -> None:
        super().__init__()
        self.settings = settings or Settings()
        self.setWindowTitle(APP_NAME)
        self.setMinimumSize(900, 600)
        self.resize(1180, 760)

        self.sidebar = Sidebar(self)
        self.library = LibraryPage(self.settings, self)
        self.chat = ChatView(self.settings, self)
        self.stack = QStackedWidget(self)
        self.stack.addWidget(self.library)
        self.stack.addWidget(self.chat)
        self.server = ServerController(self._server_backend, self)
        self.server_panel = ServerPanel(self.server, self)
        self.stack.addWidget(self.server_panel)
        self.splitter = QSplitter(self)
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(self.stack)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setCollapsible(0, False)
        self.splitter.setCollapsible(1, False)
        self.splitter.setSizes([self.sidebar.width(), 980])
        self.setCentralWidget(self.splitter)
        self.status = StatusArea(self)
        self.setStatusBar(self.status)

        self.sidebar.page_requested.connect(self.show_page)
        self.sidebar.new_chat_requested.connect(self.new_chat)
        self.sidebar.conversation_selected.connect(self.open_conversation)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.rename_requested.connect(self.rename_conversation)
        self.conversation_search = ConversationSearch(lambda: self.chat.controller.store, parent=self)
        self.conversation_search.found.connect(self._show_found)
        self.sidebar.search_changed.connect(lambda _q: self.refresh_conversations())
        self.chat.controller.conversations_listed.connect(self._show_listed)
        self.library.load_requested.connect(self.chat.load_model)
        self.library.machine_changed.connect(self.status.set_machine)
        self.library.hub_refreshed.connect(self._catalog_refreshed)
        self.library.open_folder_requested.connect(self.open_model_folder)
        self.library.demo_requested.connect(self.try_demo_model)
        self.chat.controller.model_changed.connect(self._on_model_changed)
        self.chat.controller.conversations_changed.connect(self.refresh_conversations)
        self.chat.controller.history_edited.connect(self._history_edited)
        self.chat.controller.history_notice.connect(self.status.show_notice)
        self.chat.controller.model_ready.connect(lambda: self.show_page(CHAT))
        self.server.busy_changed.connect(self._on_server_busy)
        self.chat.controller.state_changed.connect(self._say_chat_waits)
        self.library.rows_changed.connect(self._offer_models)
        self.chat.controller.state_changed.connect(self._mark_loaded)
        self.chat.model_picker.chosen.connect(self.load_model_row)
        self.chat.load_prompt.load_requested.connect(self.load_model_row)
        self.chat.load_prompt.models_requested.connect(lambda: self.show_page(LIBRARY))
        self.chat.load_prompt.demo_requested.connect(self.try_demo_model)
        self.demo_job: Job | None = None  # making the demo model, on the engine's worker

        self._build_menus()
        self._restore_state()
        self.history_ready = False  # the history is opened after the first paint (its integrity check takes time)
        self.deleted: Conversation | None = None  # the last deleted conversation (store.delete's snapshot) while Undo is offered
        self._undo_timer = QTimer(self)
        self._undo_timer.setSingleShot(True)
        self._undo_timer.timeout.connect(self._forget_deleted)

    # -- menus ---------------------------------------------------------------------------------------------------
    def _action(
        self,
        text: str,
        slot: Callable[[], object],
        shortcut: QKeySequence | QKeySequence.StandardKey | None = None,
        role: QAction.MenuRole | None = None,
    ) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        if role is not None:
            action.setMenuRole(role)
        action.triggered.connect(slot)
        self.addAction(action)  # shortcuts work even when the menu bar is hidden (offscreen tests)
        return action

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        self.new_chat_action = self._action("New Chat", self.new_chat, QKeySequence.StandardKey.New)
        self.open_folder_action = self._action("Open Model Folder…", self.open_model_folder, QKeySequence.StandardKey.Open)
        self.demo_action = self._action("Try the Demo Model", self.try_demo_model)
        self.refresh_catalog_action = self._action("Refresh Catalog from Hub", self.refresh_catalog)
        self.preferences_action = self._action("Preferences…", self.show_preferences, QKeySequence.StandardKey.Preferences, QAction.MenuRole.PreferencesRole)
        if self.preferences_action.shortcut().isEmpty():  # Linux has no standard Preferences key
            self.preferences_action.setShortcut(QKeySequence("Ctrl+,"))
        self.about_action = self._action(f"About {APP_NAME}", self.show_about, None, QAction.MenuRole.AboutRole)
        self.quit_action = self._action("Quit", self.close, QKeySequence.StandardKey.Quit, QAction.MenuRole.QuitRole)
        for a in (
            self.new_chat_action,
            self.open_folder_action,
            self.demo_action,
            self.refresh_catalog_action,
            None,
            self.preferences_action,
            self.about_action,
            None,
            self.quit_action,
        ):
            file_menu.addSeparator() if a is None else file_menu.addAction(a)

        chat_menu = bar.addMenu("&Chat")
        self.stop_action = self._action("Stop", self.chat.escape, QKeySequence(Qt.Key.Key_Escape))
        self.stop_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.regenerate_action = self._action("Regenerate Last Reply", self.chat.regenerate, QKeySequence("Ctrl+R"))
        self.edit_action = self._action("Edit Last Message", self.chat.edit_last, QKeySequence("Ctrl+E"))
        self.unload_action = self._action("Unload Model", self.chat.unload_model)
        self.tools_action = self._action("Tools (MCP Servers)…", self.show_tools)
        for a in (self.stop_action, self.regenerate_action, self.edit_action, None, self.unload_action, None, self.tools_action):
            chat_menu.addSeparator() if a is None else chat_menu.addAction(a)

        view_menu = bar.addMenu("&View")
        view_menu.addAction(self._action(TITLES[LIBRARY], lambda: self.show_page(LIBRARY), QKeySequence(KEYS[LIBRARY])))
        view_menu.addAction(self._action(TITLES[CHAT], lambda: self.show_page(CHAT), QKeySequence(KEYS[CHAT])))
        view_menu.addAction(self._action(TITLES[SERVER], lambda: self.show_page(SERVER), QKeySequence(KEYS[SERVER])))

    # -- actions -------------------------------------------------------------------------------------------------
    def show_tools(self) -> ToolsPane:
        """The Tools pane: the MCP servers, their tools, the tools allowed without asking."""
        pane = ToolsPane(self.chat.controller.tools, self)
        pane.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        pane.open()
        return pane

    def show_page(self, index: int) -> None:
        if index < 0:
            return
        self.stack.setCurrentIndex(index)
        self.sidebar.nav.blockSignals(True)
        self.sidebar.nav.setCurrentRow(index)
        self.sidebar.nav.blockSignals(False)
        self.settings.set("window.page", index)

    def refresh_catalog(self) -> None:
        self.status.showMessage("Reading the catalog's configs and file sizes from the hub…")
        self.library.refresh_from_hub()

    def _catalog_refreshed(self, errors: dict[str, str]) -> None:
        if "*" in errors:
            self.status.showMessage(f"Catalog not refreshed: {errors['*']}", 10000)
        elif errors:
            self.status.showMessage(f"Catalog refreshed; {len(errors)} builds could not be read (built-in data kept)", 10000)
        else:
            self.status.showMessage("Catalog refreshed: exact sizes from the hub", 10000)

    def new_chat(self) -> None:
        self.chat.new_chat()
        self.show_page(CHAT)

    def open_conversation(self, key: int) -> None:
        self.chat.open_conversation(key)
        self.show_page(CHAT)

    undo_seconds = 10

    def _listed_title(self, key: int) -> str:
        for i in range(self.sidebar.conversations.count()):
            item = self.sidebar.conversations.item(i)
            if item.data(Qt.ItemDataRole.UserRole) == key:
                return item.toolTip() or item.text()
        return "this conversation"

    def delete_conversation(self, key: int, confirm: bool = True) -> bool:
        """Delete a conversation (off the GUI thread: _history_edited says when); Undo in the status bar puts it
        back for a few seconds. False when not confirmed."""
        title = self._listed_title(key)
        if confirm:
            answer = QMessageBox.question(
                self,
                "Delete Conversation",
                f"Delete “{title}”? You can undo it for a few seconds.",
                QMessageBox.StandardButton.Cancel | QMessageBox.StandardButton.Yes,
                QMessageBox.StandardButton.Cancel,
            )
            if answer != QMessageBox.StandardButton.Yes:
                return False
        if key in (self.chat.controller.conversation_id, self.chat.controller.opening):
            self.chat.new_chat()
        self.chat.controller.delete_conversation(key, title)
        return True

    def undo_delete(self) -> None:
        """Put back the conversation deleted last (off the GUI thread: _history_edited says when)."""
        snapshot, self.deleted = self.deleted, None
        self.status.clear_undo()
        if snapshot is not None:
            self.chat.controller.restore_conversation(snapshot)

    def _history_edited(self, edit: HistoryEdit) -> None:
        """A delete, restore or rename done on the history's worker (an error is said, never raised into Qt)."""
        if edit.error is not None:
            self.status.showMessage(f"Could not {edit.kind.value} “{edit.title}”: {edit.error}", 10000)
        elif edit.kind is EditKind.DELETE:
            self.deleted = edit.snapshot
            self.status.offer_undo(f"Deleted “{edit.title}”", self.undo_delete)
            self._undo_timer.start(self.undo_seconds * 1000)
        elif edit.kind is EditKind.RESTORE:
            self.status.showMessage(f"Restored “{edit.title}”", 5000)
        self.refresh_conversations()

    def _forget_deleted(self) -> None:
        self.deleted = None
        self.status.clear_undo()

    def rename_conversation(self, key: int) -> None:
        title, ok = QInputDialog.getText(self, "Rename Conversation", "Title:", text=self._listed_title(key))
        if ok and title.strip():
            self.chat.controller.rename_conversation(key, title.strip())  # off the GUI thread: _history_edited

    def refresh_conversations(self) -> None:
        if not self.history_ready:
            return
        query = self.sidebar.search.text().strip()
        if not query:
            self.conversation_search.cancel()
            self.chat.controller.list_conversations()  # off the GUI thread: _show_listed shows them
            return
        self.conversation_search.find(query)  # debounced, off the GUI thread: _show_found shows what it finds

    def _show_listed(self, rows: list[tuple[int, str]]) -> None:
        if not self.sidebar.search.text().strip():  # a search typed meanwhile shows what it finds instead
            self.sidebar.set_conversations(rows, self.chat.controller.conversation_id)

    def _show_found(self, query: str, rows: list[tuple[int, str]]) -> None:
        self.sidebar.set_conversations(rows, self.chat.controller.conversation_id, empty=f"No messages match “{query}”")

    def open_model_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open a Model Folder (MLX format)")
        if folder:
            self.library.open_local_folder(folder)

    # -- models for the chat ------------------------------------------------------------------------------------
    def _offer_models(self) -> None:
        choices = [
            Choice(row.key, f"{row.title} · {row.ref.bits}-bit" if row.ref.bits else row.title, Path(row.local_path), row.title)
            for row in self.library.rows_on_disk()
            if row.local_path is not None  # all of them: on disk
        ]
        self.chat.set_model_choices(choices)
        self._mark_loaded()

    def _mark_loaded(self) -> None:
        ref = self.chat.controller.model_ref
        self.library.set_loaded(ref.local_path if ref is not None else None)

    def load_model_row(self, key: str) -> None:
        """Load a library row picked on the Chat page (the library's guardrail applies)."""
        self.library.load_row(key)

    def try_demo_model(self) -> None:
        """Make the tiny demo model (once; on the engine's worker, the window stays live), add it, load it."""
        if self.demo_job is not None:
            return
        self.status.showMessage("Making the demo model (a tiny model with random weights, about a second)…")
        self.demo_job = build_job(self.chat.controller._ensure_engine())
        bridge = EventBridge(parent=self)

        def done(batch: list[Event]) -> None:
            self.demo_job = None
            bridge.deleteLater()
            match batch[-1]:
                case DemoReady(path=path):
                    self.status.showMessage("Demo model ready: the same reply to anything, it only shows the app working", 10000)
                    if self.library.open_local_folder(path) is not None:
                        self.library.request_load()
                case Failed(message=message):
                    self.status.showMessage(f"Could not make the demo model: {message}", 15000)

        bridge.delivered.connect(done)
        bridge.attach(self.demo_job)

    def show_preferences(self) -> None:
        self.chat.show_settings()

    def show_about(self) -> None:
        QMessageBox.about(
            self,
            f"About {APP_NAME}",
            f"<b>{APP_NAME}</b> {__version__}<br>Run the Qwen3.5 family locally on Apple Silicon with MLX.",
        )

    def _on_model_changed(self, text: str) -> None:
        self.status.set_model(text)

    def _server_backend(self) -> ServingEngine:
        """The local server's backend on the model the chat has loaded (RuntimeError if none)."""
        from macapp.server.engine_backend import backend_for  # why: it imports MLX and mlx-lm, loaded on the engine's worker, not at start-up

        return backend_for(self.chat.controller.engine, self.chat.controller.prompt_disk)

    def _on_server_busy(self, busy: bool) -> None:
        # One engine: a chat reply sent meanwhile waits for the server's request, and says so here.
        if busy:
            self.status.showMessage("The local server is answering a request; a chat reply waits until it is done.")
        else:
            self.status.clearMessage()

    def _say_chat_waits(self) -> None:
        """A chat reply sent while the server answers waits for it: the meter says so until its reading starts."""
        if self.chat.controller.busy and self.server.busy:
            self.chat.meter.show_text("Waiting for the local server to finish a request; this reply starts right after.")

    def start_background_work(self, wait: bool = False) -> None:
        """After the first paint: open the history, probe the hardware and the download state (with `wait`, until
        the conversations are listed and the probe is done: a screenshot, a test)."""
        self.open_history()
        if wait:
            self.chat.controller.history_worker.wait()
        self.status.set_machine(self.library.machine)
        self.library.start(wait=wait)

    def open_history(self) -> None:
        """Open the chat history (integrity check included) and say what happened to a damaged or newer one."""
        if self.history_ready:
            return
        self.history_ready = True
        history = self.chat.controller.open_history()
        if history.notice and not history.unsaved:  # an unsaved history is told by the chat's history_notice
            self.status.show_notice(history.notice)
        self.refresh_conversations()

    # -- state ---------------------------------------------------------------------------------------------------
    def _restore_state(self) -> None:
        geometry = self.settings.get("window.geometry")
        if geometry and isinstance(geometry, str):
            self.restoreGeometry(QByteArray.fromBase64(geometry.encode()))
        sizes = self.settings.get("window.splitter")
        if isinstance(sizes, list) and len(sizes) == 2:
            self.splitter.setSizes([int(s) for s in sizes if isinstance(s, (int, float))])  # as saved: whole numbers
        self.show_page(int_setting(self.settings, "window.page", LIBRARY))

    def save_state(self) -> None:
        sizes: list[JSONValue] = [*self.splitter.sizes()]
        self.settings.update(
            {
                "window.geometry": bytes(self.saveGeometry().toBase64().data()).decode(),
                "window.splitter": sizes,
            }
        )

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        self.save_state()
        self.server.stop(wait=True)
        self.chat.shutdown()
        self.library.shutdown()
        super().closeEvent(event)
