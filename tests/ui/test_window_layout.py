"""What a newcomer reads in the window (issue 34): whole status-bar messages, one sidebar width that fits its
titles, the platform's own shortcut names, downloads said to be unavailable before Download is pressed, and a
details pane in plain words with the ways out in view."""

from __future__ import annotations

import re
import socket

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QKeySequence

from macapp.ui.pages import CHAT, LIBRARY, SERVER, TITLES, key_text

LONG = (
    "Catalog not refreshed: the hub could not be reached (huggingface.co: [Errno -3] Temporary failure in name "
    "resolution); sizes and badges keep the built-in data until it can be"
)


def _whole_text_fits(label) -> bool:
    """Every line of the label's (wrapped) text lies inside the label, and the label inside the window."""
    needed = label.fontMetrics().boundingRect(QRect(0, 0, label.width(), 10_000), Qt.TextFlag.TextWordWrap, label.text())
    inside = label.window().rect().contains(QRect(label.mapTo(label.window(), label.rect().topLeft()), label.size()))
    return label.isVisible() and needed.height() <= label.height() and needed.width() <= label.width() and inside


def test_a_long_status_message_is_shown_whole_at_the_window_size(window, qtbot):
    window.resize(1180, 760)
    status = window.status
    for text in ("Demo model ready: it writes nonsense, it only shows the app working", LONG):
        status.showMessage(text, 10_000)
        qtbot.waitUntil(lambda: _whole_text_fits(status.message_label), timeout=60_000)
        assert status.currentMessage() == text
    assert not status.app_label.isVisibleTo(window)  # the figures step aside for a message that needs the room
    status.showMessage("Restored “a chat”", 10_000)
    qtbot.waitUntil(lambda: _whole_text_fits(status.message_label), timeout=60_000)
    assert status.app_label.isVisibleTo(window) and status.budget_label.isVisibleTo(window)  # a short one leaves them
    status.clearMessage()
    assert status.currentMessage() == "" and status.app_label.isVisibleTo(window) and not status.message_label.isVisibleTo(window)


def test_a_status_message_goes_after_its_time(window, qtbot):
    with qtbot.waitSignal(window.status.messageChanged, check_params_cb=lambda text: text == "", timeout=60_000):
        window.status.showMessage("Restored “a chat”", 50)


def test_the_sidebar_keeps_one_width_on_every_page_and_its_titles_fit(window, qtbot):
    widths = set()
    for page in (LIBRARY, CHAT, SERVER, LIBRARY):
        window.show_page(page)
        qtbot.waitUntil(lambda: window.stack.currentIndex() == page, timeout=60_000)
        widths.add(window.sidebar.width())
    assert len(widths) == 1
    nav = window.sidebar.nav
    fm = nav.fontMetrics()
    room = nav.viewport().width() - 2 * 8  # the items' padding (style.qss)
    assert all(fm.horizontalAdvance(title) <= room for title in TITLES)
    # A conversation titled as the first message of a chat often is shows whole.
    window.sidebar.set_conversations([(1, "Hello! What can you do?")])
    conversations = window.sidebar.conversations
    assert conversations.fontMetrics().horizontalAdvance("Hello! What can you do?") <= conversations.viewport().width() - 2 * 8


def test_the_chat_page_names_the_models_shortcut_as_this_platform_does(window):
    window.show_page(CHAT)
    hint = window.chat.messages.empty.text()
    native = QKeySequence("Ctrl+1").toString(QKeySequence.SequenceFormat.NativeText)
    assert f"Models ({native})" in hint and key_text(LIBRARY) == native
    if native != "⌘1":  # off macOS
        assert "⌘" not in hint


def test_an_unreachable_hub_is_said_up_front(qtbot, monkeypatch, settings):
    with socket.socket() as s:  # a port nobody listens on: the hub cannot be reached
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    from macapp.ui.main_window import MainWindow

    w = MainWindow(settings)
    qtbot.addWidget(w)
    w.start_background_work(wait=True)
    library = w.library
    qtbot.waitUntil(lambda: "cannot be reached: downloads are unavailable" in library.summary.text(), timeout=60_000)
    library.select("Qwen3.5-0.8B-4bit")
    panel = library.details.download_panel
    assert "Downloads are unavailable" in panel.headline.text() and f"127.0.0.1:{port}" in panel.headline.text()
    assert panel.download_button.isVisibleTo(w)  # pressing it tries again


def test_the_details_pane_speaks_plain_words_and_its_advice_is_in_view(window, library, qtbot):
    window.resize(1180, 760)
    details = library.details
    jargon = re.compile(r"DeltaNet|tower|YaRN|MTP")
    for context, name in ((32768, "Qwen3.5-35B-A3B-4bit"), (1_010_000, "Qwen3.5-35B-A3B-4bit"), (32768, "Qwen3.5-9B-4bit")):
        library.set_context(context)
        library.select(name)
        shown = [w for w in details.findChildren(type(details.title)) if w.isVisibleTo(details) and w is not details.derivation]
        said = [w.text() for w in shown]
        assert not [t for t in said if jargon.search(t)], [t for t in said if jargon.search(t)]
    library.set_context(32768)
    library.select("Qwen3.5-35B-A3B-4bit")
    assert library.selected_row().estimate.verdict == "too_big"
    viewport = details.scroll_area.viewport()
    qtbot.waitUntil(lambda: details.advice.isVisible() and details.advice.height() > 0, timeout=60_000)
    top = details.advice.mapTo(viewport, details.advice.rect().topLeft()).y()
    assert 0 <= top and top + details.advice.fontMetrics().height() * 3 <= viewport.height()  # its headline and first step in view


def test_the_fit_column_header_stays_short_at_the_longest_context(library):
    from macapp.ui.library_model import FIT_COL, short_context

    assert (short_context(32768), short_context(1_010_000), short_context(20000)) == ("32K", "1.01M", "20,000")
    library.set_context(1_010_000)
    assert library.model.headerData(FIT_COL, Qt.Orientation.Horizontal) == "Fit at 1.01M"


def test_the_library_table_shows_every_column_whole_at_the_window_size(window, library, tiny_dense_path, qtbot):
    window.resize(1180, 760)
    library.open_local_folder(str(tiny_dense_path))  # a "Local folder" status
    library.model.set_live_status("mlx-community/Qwen3.5-2B-4bit", "Paused 100%")
    table = library.table
    header = table.horizontalHeader()
    qtbot.waitUntil(lambda: header.length() <= table.viewport().width(), timeout=60_000)
    fm = table.fontMetrics()
    status = header.sectionSize(5)
    assert all(fm.horizontalAdvance(text) < status for text in ("Local folder", "Paused 100%", "Downloaded"))
    name = header.sectionSize(0)
    bold = table.font()
    bold.setBold(True)
    from PySide6.QtGui import QFontMetrics

    assert QFontMetrics(bold).horizontalAdvance("Qwen3.5-397B-A17B") < name
