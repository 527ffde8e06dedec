import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtGui import QAction

ROOT = Path(__file__).resolve().parents[2]


def test_menu_bar_has_the_standard_mac_items(window):
    roles = {a.menuRole() for a in window.findChildren(QAction)}
    assert {QAction.MenuRole.AboutRole, QAction.MenuRole.PreferencesRole, QAction.MenuRole.QuitRole} <= roles
    assert not window.new_chat_action.shortcut().isEmpty()
    assert window.stop_action.shortcut().toString() == "Esc"
    menus = [a.text().replace("&", "") for a in window.menuBar().actions()]
    assert menus == ["File", "Chat", "View"]


def test_qwen_desk_screenshot_flag_through_the_command(tmp_path):
    out = tmp_path / "window.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    res = subprocess.run([sys.executable, "-m", "macapp", "--screenshot", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert out.stat().st_size > 10_000


def test_quitting_with_a_model_loaded_exits_cleanly(tmp_path, tiny_dense_path):
    """Load, chat, quit: the engine stops with the window and the process exits 0 (no crash at teardown)."""
    code = f"""
import sys
from PySide6.QtCore import QTimer
from macapp.ui.app import make_application
from macapp.ui.main_window import MainWindow
from macapp.core.settings import Settings
app = make_application()
s = Settings(); s.set("chat.sampling.instant", {{"temperature": 0.0, "max_tokens": 32}})
w = MainWindow(s); w.show(); w.start_background_work(wait=True)
w.library.open_local_folder({str(tiny_dense_path)!r})
w.library.request_load()
def chat():
    if w.chat.controller.model_ref is None:
        return QTimer.singleShot(50, chat)
    w.chat.composer.thinking.setChecked(False)
    w.chat.send("hello")
    QTimer.singleShot(50, done)
def done():
    if w.chat.busy:
        return QTimer.singleShot(50, done)
    print("REPLY", w.chat.messages.widgets()[-1].answer)
    w.close()
    app.quit()
QTimer.singleShot(0, chat)
sys.exit(app.exec())
"""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "REPLY The answer is here!" in res.stdout


def test_the_engine_thread_starts_before_any_widget(tmp_path):
    """The window starts the engine's worker before Qt builds a widget (a worker started after the library page ran
    MLX ~40% slower here: bench/ui_bench.py), and starting it imports no MLX (the window paints first)."""
    code = (
        "import sys, threading\n"
        "from macapp.ui.app import make_application\n"
        "from macapp.core.engine.worker import THREAD_NAME\n"
        "make_application()\n"
        "assert THREAD_NAME in [t.name for t in threading.enumerate()], threading.enumerate()\n"
        "assert 'mlx.core' not in sys.modules and 'mlx_lm' not in sys.modules\n"
        "print('ok')\n"
    )
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", QWEN_DESK_HOME=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
