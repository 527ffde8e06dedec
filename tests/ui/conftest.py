"""UI fixtures: the real main window (offscreen) on an isolated app home, sized for a fixed 'what if' Mac."""

from __future__ import annotations

import pytest

from macapp.core.settings import Settings

WHAT_IF = {"chip": "M4 Pro", "memory_gb": 24}


@pytest.fixture
def settings(_isolated_home) -> Settings:
    s = Settings()
    s.set("machine.what_if", WHAT_IF)
    return s


@pytest.fixture
def window(qtbot, settings):
    from macapp.ui.app import make_application
    from macapp.ui.main_window import MainWindow

    make_application()
    w = MainWindow(settings)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    w.start_background_work(wait=True)
    yield w
    w.close()


@pytest.fixture
def library(window):
    return window.library


@pytest.fixture
def chat(window, library, settings, tiny_moe_path, qtbot):
    """The chat page with the tiny model loaded through the library, greedy sampling in both modes."""
    from macapp.ui.main_window import CHAT
    from tests.ui.helpers import GREEDY

    settings.set("chat.sampling.thinking", GREEDY)
    settings.set("chat.sampling.instant", GREEDY)
    library.open_local_folder(str(tiny_moe_path))
    assert library.selected_row().estimate.verdict == "fits"
    view = window.chat
    with qtbot.waitSignal(view.controller.model_ready, timeout=60_000):
        assert library.request_load()
    assert window.stack.currentIndex() == CHAT
    return view
