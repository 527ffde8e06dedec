"""A video in the window: attached (button, drop), decoded off the GUI thread with progress into a strip of the
sampled frames with its length, frame count and token cost; sent; saved by digest, and a reopened conversation
shows the strip again. The screenshot of the strip is saved as docs/video.png (looked at by hand)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, Qt, QUrl
from PySide6.QtWidgets import QFileDialog

from tests.fixtures.video import video  # noqa: F401  (fixtures)
from tests.fixtures.vision import tiny_vlm_path  # noqa: F401  (fixtures)
from tests.ui.helpers import GREEDY, open_conversation
from tests.ui.test_attachments import _drop

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
def vision_chat(window, library, settings, tiny_vlm_path, qtbot):
    settings.set("chat.sampling.thinking", GREEDY)
    settings.set("chat.sampling.instant", GREEDY)
    library.open_local_folder(str(tiny_vlm_path))
    view = window.chat
    with qtbot.waitSignal(view.controller.model_ready, timeout=60_000):
        assert library.request_load()
    return view


def test_a_video_shows_its_strip_is_sent_and_a_reopened_conversation_shows_it_again(qtbot, window, vision_chat, video, monkeypatch, tmp_path):
    chat = vision_chat
    strip = chat.composer.attachments
    clip = video("walk.mp4", size=(160, 96), frames=60, fps=10.0)
    progress, threads = [], []
    strip.progress.connect(lambda name, done, total: (progress.append((name, done, total)), threads.append(threading.current_thread())))
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(lambda *a, **k: ([str(clip)], "")))
    qtbot.mouseClick(chat.composer.attach_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: strip.pending == 0 and len(strip.thumbs()) == 1, timeout=60_000)
    (tile,) = strip.thumbs()
    assert tile.caption is not None and tile.caption.text() == "6.0 s · 12 frames · 12 tokens"
    assert tile.image.pixmap().width() > 2 * tile.image.pixmap().height()  # a strip of frames, not one picture
    assert progress[-1] == ("walk.mp4", 12, 12) and [d for _, d, _ in progress] == list(range(1, 13))
    assert all(t is threading.main_thread() for t in threads)  # said on the GUI thread, decoded off it
    window.resize(900, 640)
    # the checkout's docs/video.png is this picture, saved by hand with QWEN_DESK_SAVE_DOCS=1 (a test run leaves the tree as it is)
    shot = DOCS / "video.png" if os.environ.get("QWEN_DESK_SAVE_DOCS") == "1" else tmp_path / "video.png"
    assert chat.composer.grab().save(str(shot)) and shot.stat().st_size > 0
    chat.composer.thinking.setChecked(False)
    chat.composer.input.setPlainText("what moves?")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    user, reply = chat.messages.widgets()[-2:]
    assert reply.stats is not None and reply.stats.image_tokens == 12 and len(user.thumbnails) == 1
    conversation_id = chat.controller.conversation_id
    chat.new_chat()
    open_conversation(chat, qtbot, conversation_id)
    reopened = chat.messages.widgets()[0]
    qtbot.waitUntil(lambda: len(reopened.thumbnails) == 1, timeout=60_000)
    assert reopened.pictures[0].plan.frames == 12 and reopened.thumbnails[0].pixmap().width() > 2 * reopened.thumbnails[0].pixmap().height()
    assert "12 frames · 12 tokens" in reopened.thumbnails[0].toolTip()


def test_a_dropped_bad_video_is_named_and_a_good_one_joins(qtbot, vision_chat, video, tmp_path):
    strip = vision_chat.composer.attachments
    (tmp_path / "notes.mp4").write_text("not a video")
    with qtbot.waitSignal(strip.error, timeout=60_000) as said:
        mime = QMimeData()
        mime.setUrls([QUrl.fromLocalFile(str(tmp_path / "notes.mp4"))])
        _drop(vision_chat.composer, mime)
    assert "notes.mp4" in said.args[0] and "is not a video" in said.args[0]
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(video("ok.mov")))])
    _drop(vision_chat.composer, mime)
    qtbot.waitUntil(lambda: strip.pending == 0 and len(strip.thumbs()) == 1, timeout=60_000)


def test_a_pasted_video_file_joins_the_strip(qtbot, vision_chat, video):
    strip = vision_chat.composer.attachments
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(video("pasted.mkv")))])
    vision_chat.composer.input.insertFromMimeData(mime)  # what Cmd-V does with a copied file
    qtbot.waitUntil(lambda: strip.pending == 0 and len(strip.thumbs()) == 1, timeout=60_000)
    assert strip.thumbs()[0].caption.text() == "2.0 s · 4 frames · 8 tokens" and vision_chat.composer.input.toPlainText() == ""
