"""The GUI thread does no blocking work for a chat: during a send with pictures (pasted and from a file) and the
reopening of that conversation, every history write, PNG encoding, picture read and thumbnail scaling runs on
another thread. The real functions are called through; only the thread each ran on is noted."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage

from tests.fixtures.vision import picture, tiny_vlm_path  # noqa: F401  (fixtures)
from tests.ui.helpers import GREEDY, open_conversation


@pytest.fixture
def vision_chat(window, library, settings, tiny_vlm_path, qtbot):  # noqa: F811
    settings.set("chat.sampling.thinking", GREEDY)
    settings.set("chat.sampling.instant", GREEDY)
    library.open_local_folder(str(tiny_vlm_path))
    view = window.chat
    with qtbot.waitSignal(view.controller.model_ready, timeout=60_000):
        assert library.request_load()
    return view


class Threads:
    """Which threads ran each watched function (by name)."""

    def __init__(self, monkeypatch):
        self.seen: dict[str, list[threading.Thread]] = {}
        self.monkeypatch = monkeypatch

    def watch(self, owner, attribute: str, name: str) -> None:
        real = getattr(owner, attribute)
        seen = self.seen.setdefault(name, [])

        def watched(*args, **kwargs):
            seen.append(threading.current_thread())
            return real(*args, **kwargs)

        self.monkeypatch.setattr(owner, attribute, watched)

    def on_gui_thread(self) -> list[str]:
        return [name for name, threads in self.seen.items() if threading.main_thread() in threads]


def test_a_send_with_pictures_and_its_reopening_do_no_blocking_work_on_the_gui_thread(vision_chat, qtbot, picture, monkeypatch):  # noqa: F811
    from macapp.core.vision import images, pictures
    from macapp.ui import attachments

    chat = vision_chat
    store = chat.controller.store
    threads = Threads(monkeypatch)
    threads.watch(store.database, "write", "history write")
    threads.watch(images.PreparedImage, "png_bytes", "PNG encoding of a sent picture")
    threads.watch(attachments, "qimage_png", "PNG encoding of a pasted picture")
    threads.watch(attachments, "preview", "thumbnail scaling")
    threads.watch(pictures, "load_pictures", "reading a saved message's pictures")

    pasted = QImage(80, 48, QImage.Format.Format_RGB888)
    pasted.fill(QColor(200, 30, 30))
    chat.composer.attachments.add_qimage(pasted)
    chat.composer.attachments.add_files([picture("hills.png", (96, 64))])
    qtbot.waitUntil(lambda: len(chat.composer.attachments.thumbs()) == 2, timeout=60_000)
    chat.composer.thinking.setChecked(False)
    chat.composer.input.setPlainText("what are these?")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    conversation_id = chat.controller.conversation_id
    saved = store.get_conversation(conversation_id).messages
    assert [m.role.value for m in saved] == ["user", "assistant"] and len(saved[0].images) == 2

    chat.new_chat()
    open_conversation(chat, qtbot, conversation_id)
    reopened = chat.messages.widgets()[0]
    qtbot.waitUntil(lambda: len(reopened.thumbnails) == 2, timeout=60_000)

    assert all(threads.seen.values()), {name: len(t) for name, t in threads.seen.items()}  # each one did run
    assert threads.on_gui_thread() == []
