"""`qwen-desk` with no command: the window. Paints first; MLX is only imported on the engine's worker thread."""

from __future__ import annotations

import sys

from PySide6.QtCore import QCoreApplication, Qt, QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QWidget

from macapp import APP_NAME, __version__
from macapp.core.paths import resources_dir
from macapp.core.engine.worker import start_worker
from macapp.core.settings import Settings
from macapp.ui.main_window import MainWindow
from macapp.ui.qt_platform import choose_screenshot_platform, platform_problem
from macapp.ui.style import apply_style, follow_system_appearance


def make_application(argv: list[str] | None = None) -> QApplication:
    start_worker()  # before any widget: see start_worker (this imports no MLX)
    existing = QApplication.instance()
    if isinstance(existing, QApplication):
        app = existing
    else:
        QCoreApplication.setAttribute(Qt.ApplicationAttribute.AA_DontShowIconsInMenus, True)
        app = QApplication(argv if argv is not None else sys.argv[:1])
    app.setApplicationName(APP_NAME)
    app.setApplicationDisplayName(APP_NAME)
    app.setApplicationVersion(__version__)
    app.setOrganizationName(APP_NAME)
    icon = resources_dir() / "icon.png"
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    apply_style(app)
    follow_system_appearance(app)
    return app


def save_window_png(window: QWidget, path: str) -> None:
    """Render the window (no screen needed: works with QT_QPA_PLATFORM=offscreen)."""
    app = QApplication.instance()
    assert app is not None  # a widget exists, so an application does
    for _ in range(5):
        app.processEvents()
    if not window.grab().save(path):
        raise OSError(f"could not write the screenshot to {path}")


def run_app(screenshot: str | None = None) -> int:
    """Open the main window; with `screenshot`, render it to that PNG and exit instead."""
    if screenshot:
        choose_screenshot_platform()  # README: a screenshot needs no screen
    problem = platform_problem()
    if problem:  # Qt would abort with a message that names the wrong library
        print(problem, file=sys.stderr)
        return 1
    app = make_application()
    window = MainWindow(Settings())
    window.show()
    if screenshot:
        window.start_background_work(wait=True)
        save_window_png(window, screenshot)
        print(f"Saved the window to {screenshot}")
        window.close()
        return 0
    # Start the slower pieces (hardware probe, download state) once the first frame is on screen.
    QTimer.singleShot(0, window.start_background_work)
    return app.exec()
