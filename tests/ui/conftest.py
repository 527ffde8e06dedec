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
