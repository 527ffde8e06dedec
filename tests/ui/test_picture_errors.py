"""Issue #22: an old picture error stayed on screen after later good sends.

The error of a file that could not be used as a picture belongs to that file: it is a crossed-out tile in the
composer's strip with its reason under it, and it goes when that tile is removed or the message is sent. A picture
read that reports back after the message went (each file is read on its own thread) can neither put an error about
a message already sent back on screen nor slip a picture into the next message.

Before the fix the error went to the chat's shared error label: nothing tied it to the file (there was nothing to
remove), and a read that ended after the strip was emptied still reported into it, so the error of a picture read
for a message already sent appeared after that send, and stayed.
"""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt

from tests.fixtures.vision import picture, tiny_vlm_path  # noqa: F401  (fixtures)
from tests.ui.helpers import GREEDY, send


@pytest.fixture
def vision_chat(window, library, settings, tiny_vlm_path, qtbot):
    settings.set("chat.sampling.thinking", GREEDY)
    settings.set("chat.sampling.instant", GREEDY)
    library.open_local_folder(str(tiny_vlm_path))
    view = window.chat
    with qtbot.waitSignal(view.controller.model_ready, timeout=60_000):
        assert library.request_load()
    return view


def _not_a_picture(tmp_path, name="notes.png"):
    path = tmp_path / name
    path.write_text("words, not pixels")
    return path


def _read(qtbot, strip):
    qtbot.waitUntil(lambda: strip.pending == 0, timeout=60_000)


def _picture_error(chat) -> str | None:
    """The picture error the user sees (None when none is shown)."""
    label = chat.composer.picture_error
    return label.text() if label.isVisibleTo(chat) else None


class _Gate:
    """Holds the picture reader of `strip` for the next file until `open()`: a read that takes its time."""

    def __init__(self, monkeypatch):
        import macapp.core.vision.images as images

        self.release = threading.Event()
        self.started = threading.Event()
        real = images.open_image

        def slow(path, *args, **kwargs):
            self.started.set()
            self.release.wait(30)
            return real(path, *args, **kwargs)

        monkeypatch.setattr(images, "open_image", slow)

    def open(self):
        self.release.set()


def test_the_error_goes_with_the_file_it_describes(qtbot, vision_chat, picture, tmp_path):
    chat = vision_chat
    strip = chat.composer.attachments
    strip.add_files([_not_a_picture(tmp_path), picture("good.png", (64, 64))])
    _read(qtbot, strip)
    error = _picture_error(chat)
    assert error is not None and "notes.png" in error and "not a picture" in error
    assert not chat.error.isVisibleTo(chat)  # not the chat's own error line: that one is for replies
    bad = strip.unreadable()
    assert [t.name for t in bad] == ["notes.png"] and len(strip.thumbs()) == 1
    assert strip.tiles()[0] is bad[0]  # in the order the files were added
    qtbot.mouseClick(bad[0].remove, Qt.MouseButton.LeftButton)
    assert _picture_error(chat) is None and strip.unreadable() == [] and len(strip.thumbs()) == 1


def test_the_error_goes_when_the_message_is_sent_and_does_not_come_back(qtbot, vision_chat, picture, tmp_path):
    chat = vision_chat
    strip = chat.composer.attachments
    strip.add_files([_not_a_picture(tmp_path), picture("good.png", (64, 64))])
    _read(qtbot, strip)
    assert _picture_error(chat) is not None
    reply = send(chat, qtbot, "what is this?", thinking=False)
    user = chat.messages.widgets()[-2]
    assert [p.name.rsplit("/", 1)[-1] for p in user.pictures] == ["good.png"]  # the good one went, the bad one did not
    assert reply.stats is not None and reply.stats.image_tokens > 0
    assert _picture_error(chat) is None and strip.tiles() == []
    send(chat, qtbot, "and now?", thinking=False)  # later good sends: still nothing about that old file
    assert _picture_error(chat) is None and not chat.error.isVisibleTo(chat)


def test_a_text_only_send_also_takes_the_error_away(qtbot, vision_chat, tmp_path):
    chat = vision_chat
    strip = chat.composer.attachments
    strip.add_files([_not_a_picture(tmp_path)])
    _read(qtbot, strip)
    assert _picture_error(chat) is not None
    send(chat, qtbot, "just text", thinking=False)
    assert _picture_error(chat) is None and strip.tiles() == [] and not strip.isVisible()


def test_a_read_that_fails_after_the_strip_was_emptied_is_not_shown(qtbot, vision_chat, tmp_path, monkeypatch):
    chat = vision_chat
    strip = chat.composer.attachments
    gate = _Gate(monkeypatch)
    strip.add_files([_not_a_picture(tmp_path, "late.png")])
    assert gate.started.wait(60) and strip.pending == 1
    assert not chat.composer.send_button.isEnabled()  # Send waits for the picture being read
    strip.clear()  # the pictures dropped (what sending does) while that file is still being read
    assert strip.pending == 0
    gate.open()  # …and only now does its read report back, failed
    qtbot.wait(300)
    assert _picture_error(chat) is None and strip.tiles() == []
    send(chat, qtbot, "a good send", thinking=False)
    assert _picture_error(chat) is None and not chat.error.isVisibleTo(chat)


def test_a_send_waits_for_a_picture_still_being_read(qtbot, vision_chat, picture, tmp_path, monkeypatch):
    """The chat's own send (not only the composer's button) waits: a picture read after it would land in the next
    message, and its error after a send that did not include it."""
    chat = vision_chat
    strip = chat.composer.attachments
    gate = _Gate(monkeypatch)
    strip.add_files([_not_a_picture(tmp_path, "slow.png")])
    assert gate.started.wait(60)
    assert chat.send("look") is False and not chat.busy
    assert chat.composer.input.toPlainText() == "look"  # what they typed is kept
    gate.open()
    _read(qtbot, strip)
    assert "slow.png" in (_picture_error(chat) or "")  # it belongs to the message still being written
    send(chat, qtbot, "look", thinking=False)
    assert _picture_error(chat) is None


def test_a_reader_that_breaks_does_not_leave_send_waiting(qtbot, vision_chat, tmp_path, monkeypatch):
    import macapp.core.vision.images as images

    def broken(path, *args, **kwargs):
        raise struct_error("unpack requires a buffer of 4 bytes")

    struct_error = __import__("struct").error
    monkeypatch.setattr(images, "open_image", broken)
    chat = vision_chat
    chat.composer.attachments.add_files([tmp_path / "odd.tif"])
    _read(qtbot, chat.composer.attachments)
    assert "odd.tif" in _picture_error(chat) and "could not be read" in _picture_error(chat)
    chat.composer.input.setPlainText("still works")
    assert chat.composer.send_button.isEnabled()
