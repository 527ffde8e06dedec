"""The Local Server page's "Remember key" (issue #19): kept between runs through macapp/core/secrets.py (off macOS,
and here, the 0600 file in the app home), forgotten when unticked, saved as it is when Start is pressed; a key
that cannot be kept says so and is never logged. Real widgets, offscreen; a real KeyStore on the test's app home."""

from __future__ import annotations

import logging
import stat
import sys

import pytest
from PySide6.QtCore import Qt

from macapp.core.paths import app_home
from macapp.core.secrets import KEY_FILE_NAME, KeyStore
from macapp.ui.server_panel import ServerController, ServerPanel

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="on macOS the key goes to the user's real keychain")


def no_model():
    raise RuntimeError("Load a model first.")  # what the window's factory says with no model loaded


@pytest.fixture
def make_panel(qtbot):
    def make() -> ServerPanel:
        panel = ServerPanel(ServerController(no_model))
        qtbot.addWidget(panel)
        return panel

    return make


def key_file():
    return app_home() / KEY_FILE_NAME


def test_ticking_remember_keeps_the_key_for_the_next_window(make_panel, qtbot):
    panel = make_panel()
    assert panel.api_key.text() == "" and not panel.remember.isChecked() and not key_file().exists()
    qtbot.keyClicks(panel.api_key, "s3cret-key")
    qtbot.mouseClick(panel.remember, Qt.MouseButton.LeftButton)
    assert panel.remember.isChecked()
    assert key_file().read_text() == "s3cret-key" and stat.S_IMODE(key_file().stat().st_mode) == 0o600
    assert "file only you can read" in panel.remember.toolTip()

    again = make_panel()  # the next run of the window
    assert again.api_key.text() == "s3cret-key" and again.remember.isChecked()
    qtbot.mouseClick(again.remember, Qt.MouseButton.LeftButton)  # untick: forgotten
    assert not key_file().exists() and KeyStore.default().load() is None
    third = make_panel()
    assert third.api_key.text() == "" and not third.remember.isChecked()


def test_start_saves_the_key_as_it_is_then(make_panel, qtbot):
    panel = make_panel()
    qtbot.mouseClick(panel.remember, Qt.MouseButton.LeftButton)  # ticked with no key yet: nothing kept
    assert not key_file().exists()
    qtbot.keyClicks(panel.api_key, "first")
    with qtbot.waitSignal(panel.controller.failed, timeout=60_000):  # no model: the start fails, the key is kept
        qtbot.mouseClick(panel.toggle, Qt.MouseButton.LeftButton)
    assert key_file().read_text() == "first"
    panel.api_key.clear()
    qtbot.keyClicks(panel.api_key, "second")
    qtbot.mouseClick(panel.toggle, Qt.MouseButton.LeftButton)
    assert key_file().read_text() == "second"
    assert "Load a model first." in panel.message.text()
    panel.api_key.clear()
    qtbot.mouseClick(panel.toggle, Qt.MouseButton.LeftButton)  # an emptied field forgets the key
    assert not key_file().exists()


def test_a_key_that_cannot_be_kept_says_so_and_is_not_logged(make_panel, qtbot, caplog):
    panel = make_panel()
    panel.api_key.insert("clé-secrète")  # pasted (QTest aborts typing non-ASCII)
    with caplog.at_level(logging.DEBUG):
        qtbot.mouseClick(panel.remember, Qt.MouseButton.LeftButton)
    assert "not remembered" in panel.message.text() and "ASCII" in panel.message.text()
    assert not key_file().exists()
    assert "secrète" not in caplog.text and "secrète" not in panel.message.text()
