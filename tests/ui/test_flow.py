"""The whole story through the real window: pick a model, see its badge, download it from the hub stand-in, load it,
chat with thinking on and off, stop, regenerate."""

from PySide6.QtCore import Qt

from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING
from macapp.ui.library_model import FIT_COL
from macapp.ui.main_window import CHAT

REPO = "mlx-community/Qwen3.5-0.8B-4bit"  # a catalog row; the stand-in serves a tiny model's files under that name
GREEDY = {"temperature": 0.0, "presence_penalty": 0.0, "top_k": 0, "max_tokens": 64}


def test_pick_download_load_chat_stop_regenerate(window, library, settings, hub_server, tiny_moe_4bit_path, qtbot):
    settings.set("chat.sampling.thinking", GREEDY)
    settings.set("chat.sampling.instant", GREEDY)
    hub_server.add_repo(REPO, tiny_moe_4bit_path)

    # Pick the model and see its badge.
    row = library.select(REPO)
    index = library.model.index(library.model.rows.index(row), FIT_COL)
    assert library.model.data(index) == "Fits" and library.details.badge.text() == "Fits"

    # Download it.
    finished = []
    library.downloads.finished.connect(finished.append)
    library.details.download_panel.download_button.click()
    qtbot.waitUntil(lambda: finished == [REPO], timeout=60_000)
    assert library.details.load_button.isEnabled()

    # Load it: the chat page opens when it is ready.
    chat = window.chat
    with qtbot.waitSignal(chat.controller.model_ready, timeout=60_000):
        library.details.load_button.click()
    assert window.stack.currentIndex() == CHAT and chat.controller.model_info.bits == 4

    def ask(text, thinking):
        chat.composer.thinking.setChecked(thinking)
        chat.composer.input.setPlainText(text)
        qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
        return chat.messages.widgets()[-1]

    on = ask("Think first", thinking=True)
    assert on.reasoning.text.strip() == "".join(SCRIPT_REASONING) and on.view.source_text == "".join(SCRIPT_ANSWER)
    off = ask("Answer straight away", thinking=False)
    assert off.reasoning is None and off.view.source_text == "".join(SCRIPT_ANSWER)

    # Stop a long reply (end tokens biased away), then regenerate it.
    chat.controller.sampling_overrides = {"logit_bias": {2: -100.0, 0: -100.0}, "max_tokens": 4000}
    chat.composer.input.setPlainText("Go on and on")
    qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: chat.messages.current is not None and len(chat.messages.current.answer) > 20, timeout=60_000)
    chat.composer.send_button.click()  # the Send button is Stop while generating
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    assert "stopped" in chat.messages.widgets()[-1].stats_label.text()
    chat.controller.sampling_overrides = {}
    chat.regenerate_button.click()
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    last = chat.messages.widgets()[-1]
    assert last.view.source_text == "".join(SCRIPT_ANSWER) and "stopped" not in last.stats_label.text()
    roles = [m.role for m in chat.controller.store.get_conversation(chat.controller.conversation_id).messages]
    assert roles == ["user", "assistant"] * 3
