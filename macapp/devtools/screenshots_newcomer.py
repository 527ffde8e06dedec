"""Screenshots of a newcomer's first hour (issue #22): the demo model, the load prompt, the library's remembered
folder and loaded row, offline, a clamped setting, a taken port, the Undo bar, long-context mode (#24). `python -m macapp.devtools.screenshots_newcomer
docs/` (also run by `make screenshots`). Offscreen, on a throwaway app home, the same 'what if' Mac as the others.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from macapp.core.settings import Settings
from macapp.ui.pages import CHAT, LIBRARY, SERVER  # page numbers only: Qt, no hub settings read at import
from macapp.devtools.screenshots import SIZE, WHAT_IF, _save, _wait, work_folder
from macapp.core.demo.tiny_model import make_tiny_model

if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication

    from macapp.ui.main_window import MainWindow


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "docs").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = work_folder()
    os.environ["QWEN_DESK_HOME"] = str(work / "home")
    os.environ["HF_HOME"] = str(work / "hf")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["HF_HUB_OFFLINE"] = "1"

    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    # The window's modules only now, after the environment above: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE once, when first imported.
    from macapp.ui.app import make_application
    from macapp.ui.main_window import MainWindow

    app = make_application()
    settings = Settings()
    settings.update({"machine.what_if": WHAT_IF, "library.context": 32768, "chat.thinking": False})
    window = MainWindow(settings)
    window.resize(*SIZE)
    window.show()
    window.start_background_work(wait=True)
    chat, lib = window.chat, window.library

    # 1. Try the Demo Model: made, loaded, labelled; one reply.
    window.demo_action.trigger()
    _wait(app, lambda: chat.controller.model_ref is not None, 120)
    settings.set("chat.sampling.instant", {"temperature": 0.0, "presence_penalty": 0.0, "max_tokens": 64})
    chat.send("Hello! What can you do?")
    _wait(app, lambda: not chat.busy)
    window.show_page(CHAT)
    _save(app, window, out / "newcomer-demo.png")

    # 2. The library after a restart would list the folder; the loaded row says so; speed and status apart.
    window.show_page(LIBRARY)
    demo = chat.controller.model_ref
    if demo is None:
        raise RuntimeError("the demo model is not loaded")
    lib.select(str(demo.local_path))
    _save(app, window, out / "newcomer-library.png")

    # 2b. Offline: the library says downloads are unavailable before Download is pressed; a refresh's message is
    #     shown whole in the status bar.
    window.refresh_catalog()
    _wait(app, lambda: window.status.currentMessage().startswith("Catalog not refreshed"), 20)
    lib.select("Qwen3.5-9B-4bit")
    _save(app, window, out / "newcomer-offline.png")
    window.status.clearMessage()

    # 3. The conversation reopened with no model loaded: why Send is off, and its own model offered.
    key = chat.controller.conversation_id
    if key is None:
        raise RuntimeError("the first reply was not saved as a conversation")
    chat.unload_model()
    window.new_chat()
    window.open_conversation(key)  # read on the history's worker: wait for it to arrive
    _wait(app, lambda: chat.controller.conversation_id == key and chat.controller.history_worker.pending == 0, 20)
    _save(app, window, out / "newcomer-load-prompt.png")

    # 4. Temperature 50 typed: clamped to 2.00 and said so.
    chat.show_settings()
    dialog = chat.settings_dialog
    if dialog is None:
        raise RuntimeError("the chat settings did not open")
    box = dialog.inputs["temperature"]
    box.lineEdit().selectAll()
    QTest.keyClicks(box.lineEdit(), "50")
    QTest.keyClick(box.lineEdit(), Qt.Key.Key_Return)  # the Enter that clamps keeps the panel open
    _wait(app, lambda: dialog.range_note.isVisible(), 5)
    _save(app, dialog, out / "newcomer-settings.png")
    dialog.reject()

    # 5. The Local Server on a port another program holds.
    lib.load_row(str(chat.model_choices[0].key))
    _wait(app, lambda: chat.controller.model_ref is not None, 120)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        window.show_page(SERVER)
        window.server_panel.port.setValue(taken.getsockname()[1])
        window.server_panel.toggle.click()
        _wait(app, lambda: "already in use" in window.server_panel.message.text(), 20)
    _save(app, window, out / "newcomer-port.png")

    # 6. A deleted conversation's Undo: in the status bar, which keeps its figures.
    window.delete_conversation(key, confirm=False)
    _wait(app, lambda: chat.controller.history_worker.pending == 0, 20)  # the delete runs on the history's worker
    window.show_page(CHAT)
    _save(app, window, out / "newcomer-undo.png")

    # 7. Long-context mode (#24): the library at 1M (the badge sized there, the details say YaRN ×4), then a
    #    model loaded past its native length (a tiny one, 512 native) with the chat page saying so.
    long_context_shots(app, window, out, work)

    window.close()
    return 0


def long_context_shots(app: QApplication, window: MainWindow, out: Path, work: Path) -> None:
    from tests.fixtures.models import with_native_length

    chat, lib = window.chat, window.library
    if chat.controller.model_ref is not None:
        chat.unload_model()
    window.new_chat()
    window._forget_deleted()  # the Undo of shot 6 has had its time
    window.status.clearMessage()
    window.show_page(LIBRARY)
    lib.set_context(1_010_000)
    lib.select("Qwen3.5-35B-A3B-4bit")
    _save(app, window, out / "newcomer-long-context.png")

    model = with_native_length(make_tiny_model(work / "tiny-native512", kind="dense"), 512)
    lib.set_context(1536)  # past the tiny model's native 512: YaRN ×4
    if lib.open_local_folder(str(model)) is not None:
        lib.request_load()
    _wait(app, lambda: chat.controller.model_ref is not None and chat.controller.model_ref.local_path == model, 120)
    chat.send("the answer is here and there " * 90)  # ~760 tokens: past the native 512
    _wait(app, lambda: not chat.busy)
    window.show_page(CHAT)
    _save(app, window, out / "newcomer-long-context-chat.png")


if __name__ == "__main__":
    raise SystemExit(main())
