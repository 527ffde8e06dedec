"""Pictures in the window: the attach button, drag and drop, paste; thumbnails in the composer and in the message;
several per message; remove before sending; bad files named; a reopened conversation shows its pictures."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QImage
from PySide6.QtWidgets import QApplication, QFileDialog

from macapp.ui.composer import Composer
from tests.fixtures.vision import picture, tiny_vlm_path  # noqa: F401  (fixtures)
from tests.ui.helpers import GREEDY, open_conversation


@pytest.fixture
def composer(qtbot):
    from macapp.ui.app import make_application

    make_application()
    c = Composer()
    qtbot.addWidget(c)
    c.show()
    qtbot.waitExposed(c)
    return c


def _settled(qtbot, composer, count):
    qtbot.waitUntil(lambda: composer.attachments.pending == 0 and len(composer.attachments.thumbs()) == count, timeout=60_000)


def test_the_button_attaches_several_and_each_can_be_removed(qtbot, composer, picture, monkeypatch):
    files = [str(picture("a.png", (120, 80))), str(picture("b.jpg", (50, 50), "JPEG"))]
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(lambda *a, **k: (files, "")))  # the user's choice
    assert not composer.attachments.isVisible()
    qtbot.mouseClick(composer.attach_button, Qt.MouseButton.LeftButton)
    _settled(qtbot, composer, 2)
    assert composer.attachments.isVisible()
    assert [p.name for p in composer.attachments.pictures()] == files
    first = composer.attachments.thumbs()[0]
    assert first.image.pixmap().width() <= 64 and "120×80" in first.toolTip()
    qtbot.mouseClick(first.remove, Qt.MouseButton.LeftButton)
    _settled(qtbot, composer, 1)
    assert [p.name for p in composer.attachments.pictures()] == files[1:]
    assert composer.attachments.take()[0].name == files[1] and composer.attachments.thumbs() == []
    assert not composer.attachments.isVisible()


def test_pictures_keep_the_order_they_were_added_in(qtbot, composer, picture):
    slow, quick = picture("slow.png", (3000, 2000)), picture("quick.png", (16, 16))  # the first takes longer to read
    composer.attachments.add_files([slow, quick])
    _settled(qtbot, composer, 2)
    assert [p.name for p in composer.attachments.pictures()] == [str(slow), str(quick)]


def test_a_bad_file_is_named_and_nothing_is_added(qtbot, composer, tmp_path):
    (tmp_path / "notes.png").write_text("words")
    with qtbot.waitSignal(composer.attachments.error, timeout=60_000) as said:
        composer.attachments.add_files([tmp_path / "notes.png"])
    assert "notes.png" in said.args[0] and "not a picture" in said.args[0]
    assert composer.attachments.thumbs() == [] and composer.attachments.pending == 0


def _drop(widget, mime):
    """A drag entering `widget`, then the drop (Qt delivers a drop only to the widget that accepted the enter)."""
    enter = QDragEnterEvent(QPoint(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted()
    drop = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, drop)
    return drop


def test_drag_and_drop_of_picture_files(qtbot, composer, picture):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(picture("drop1.png"))), QUrl.fromLocalFile(str(picture("drop2.gif", fmt="GIF")))])
    _drop(composer, mime)  # onto the composer
    _settled(qtbot, composer, 2)
    one = QMimeData()
    one.setUrls([QUrl.fromLocalFile(str(picture("drop3.webp", fmt="WEBP")))])
    composer.input.insertFromMimeData(one)  # onto the text box: the way Qt's text edit takes a drop
    _settled(qtbot, composer, 3)
    assert composer.input.toPlainText() == ""  # no file path typed into the message
    text = QMimeData()
    text.setText("just words")
    composer.input.insertFromMimeData(text)
    assert composer.input.toPlainText() == "just words" and len(composer.attachments.thumbs()) == 3


def test_paste_a_picture_from_the_clipboard(qtbot, composer):
    image = QImage(90, 30, QImage.Format.Format_RGB32)
    image.fill(QColor(200, 30, 30))
    QApplication.clipboard().setImage(image)
    composer.input.setFocus()
    composer.input.paste()
    _settled(qtbot, composer, 1)
    (pasted,) = composer.attachments.pictures()
    assert pasted.name == "pasted picture" and pasted.size == (90, 30)
    r, g, b = pasted.image.getpixel((5, 5))
    assert r > 180 and g < 60 and b < 60


def test_send_waits_for_a_picture_still_being_read(qtbot, composer, picture):
    composer.input.setPlainText("look")
    assert composer.send_button.isEnabled()
    composer.attachments.pending += 1  # as while a picture is read on its thread
    composer._update_enabled()
    assert not composer.send_button.isEnabled()
    composer.attachments.pending -= 1
    composer._update_enabled()
    assert composer.send_button.isEnabled()


@pytest.fixture
def vision_chat(window, library, settings, tiny_vlm_path, qtbot):
    from macapp.ui.main_window import CHAT

    settings.set("chat.sampling.thinking", GREEDY)
    settings.set("chat.sampling.instant", GREEDY)
    library.open_local_folder(str(tiny_vlm_path))
    view = window.chat
    with qtbot.waitSignal(view.controller.model_ready, timeout=60_000):
        assert library.request_load()
    assert window.stack.currentIndex() == CHAT
    return view


def test_a_message_with_pictures_shows_them_and_a_reopened_conversation_too(qtbot, window, vision_chat, picture):
    chat = vision_chat
    chat.composer.attachments.add_files([picture("one.png", (96, 64)), picture("two.png", (64, 64))])
    _settled(qtbot, chat.composer, 2)
    chat.composer.thinking.setChecked(False)
    chat.composer.input.setPlainText("what are these?")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    assert chat.composer.attachments.thumbs() == []  # they went with the message
    user, reply = chat.messages.widgets()[-2:]
    assert [p.name.rsplit("/", 1)[-1] for p in user.pictures] == ["one.png", "two.png"] and len(user.thumbnails) == 2
    assert reply.stats is not None and reply.stats.image_tokens == 6 + 4  # the pictures reached the model
    assert "(10 image)" in reply.stats_label.text()  # the reply's figures say how much of the prompt the pictures were
    conversation_id = chat.controller.conversation_id
    chat.new_chat()
    open_conversation(chat, qtbot, conversation_id)
    reopened = chat.messages.widgets()[0]
    qtbot.waitUntil(lambda: len(reopened.thumbnails) == 2, timeout=60_000)  # read and made small off the GUI thread
    assert reopened.pictures[0].size == (96, 64)
    chat.composer.input.setPlainText("and the second one?")  # going on: the model reads the reopened pictures again
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    follow_up = chat.messages.widgets()[-1]
    assert follow_up.stats is not None and follow_up.stats.image_tokens == 6 + 4


def test_a_text_only_build_says_so_and_keeps_the_message(qtbot, chat, picture):
    chat.composer.attachments.add_files([picture()])
    _settled(qtbot, chat.composer, 1)
    chat.composer.input.setPlainText("look at this")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    assert "text-only" in chat.error.text() and chat.error.isVisibleTo(chat)


def test_the_library_and_details_say_which_builds_accept_pictures(window, library, tiny_vlm_path, tiny_dense_path):
    from PySide6.QtCore import Qt as _Qt

    library.open_local_folder(str(tiny_vlm_path))
    row = library.selected_row()
    assert row.estimate.accepts_images is True and row.estimate.vision_bytes > 0
    assert library.details.pictures.text().startswith("Pictures: yes (the part that reads them takes")
    index = library.model.index(library.model.rows.index(row), 0)
    assert "Pictures: yes" in library.model.data(index, _Qt.ItemDataRole.ToolTipRole)
    library.open_local_folder(str(tiny_dense_path))
    assert "text-only" in library.details.pictures.text()
    big = next(r for r in library.model.rows if r.ref.repo == "mlx-community/Qwen3.5-397B-A17B-4bit")
    assert big.estimate.accepts_images is False
    from macapp.ui.details import images_words

    small = next(r for r in library.model.rows if r.ref.repo == "mlx-community/Qwen3.5-2B-4bit")  # sees; no vision_config at hand
    assert small.estimate.accepts_images is True and images_words(small.estimate).startswith("Pictures: yes (the memory they take is known once")
