"""Choosing a model in the window: folders remembered, the loaded row marked, the Chat page's picker, the load
prompt of a reopened conversation, and the demo model (real window offscreen, real engine, tiny models)."""

from __future__ import annotations

from pathlib import Path

from macapp.core.settings import Settings
from macapp.core.demo import model as demo
from macapp.ui.main_window import CHAT, MainWindow


def _reopen(qtbot) -> MainWindow:
    """A new window on the same app home and settings file: the app after a restart."""
    w = MainWindow(Settings())
    qtbot.addWidget(w)
    w.show()
    w.start_background_work(wait=True)
    return w


def test_an_opened_folder_is_remembered_after_a_restart_and_can_be_removed(window, library, tiny_dense_path, qtbot):
    row = library.open_local_folder(str(tiny_dense_path))
    assert row.local_path == tiny_dense_path.resolve()
    window.close()
    again = _reopen(qtbot)
    try:
        keys = [r.key for r in again.library.model.rows]
        assert str(tiny_dense_path.resolve()) in keys
        again.library.select(str(tiny_dense_path.resolve()))
        assert again.library.remove_folder_button.isVisibleTo(again)
        again.library.remove_folder_button.click()
        assert str(tiny_dense_path.resolve()) not in [r.key for r in again.library.model.rows]
        assert Path(tiny_dense_path, "config.json").is_file()  # forgotten here, not deleted
    finally:
        again.close()
    third = _reopen(qtbot)
    try:
        assert str(tiny_dense_path.resolve()) not in [r.key for r in third.library.model.rows]
    finally:
        third.close()


def test_the_loaded_model_is_marked_in_the_library_and_picked_on_the_chat_page(chat, window, library, tiny_moe_path):
    row = library.select(str(tiny_moe_path.resolve()))
    column = 5
    assert library.model.data(library.model.index(library.model.rows.index(row), column)) == "Loaded"
    picker = chat.model_picker
    assert picker.isEnabled() and picker.currentText().startswith(tiny_moe_path.name)
    assert not chat.load_prompt.isVisible()
    chat.unload_model()
    assert library.model.data(library.model.index(library.model.rows.index(row), column)) == "Local folder"
    assert picker.currentIndex() == 0


def test_choosing_in_the_picker_loads_that_model(window, library, tiny_moe_path, tiny_dense_path, qtbot):
    library.open_local_folder(str(tiny_moe_path))
    library.open_local_folder(str(tiny_dense_path))
    picker = window.chat.model_picker
    labels = [picker.itemText(i) for i in range(picker.count())]
    index = next(i for i, text in enumerate(labels) if text.startswith(tiny_dense_path.name))
    with qtbot.waitSignal(window.chat.controller.model_ready, timeout=60_000):
        picker.activated.emit(index)
    assert window.chat.controller.model_ref.local_path == tiny_dense_path.resolve()
    assert picker.currentIndex() == index


def test_a_reopened_conversation_without_a_model_says_load_one_and_offers_its_own(chat, window, qtbot, tiny_moe_path):
    from tests.ui.helpers import open_conversation, send

    send(chat, qtbot, "hello", thinking=False)
    key = chat.controller.conversation_id
    chat.unload_model()
    window.new_chat()
    open_conversation(window, qtbot, key)
    prompt = chat.load_prompt
    assert prompt.isVisibleTo(window)
    assert "Load a model to continue" in prompt.text.text()
    assert prompt.load_button.isVisibleTo(window) and tiny_moe_path.name in prompt.load_button.text()
    assert not chat.composer.send_button.isEnabled()
    with qtbot.waitSignal(chat.controller.model_ready, timeout=60_000):
        prompt.load_button.click()
    assert not prompt.isVisible()
    assert window.stack.currentIndex() == CHAT


def test_a_conversations_model_that_is_not_on_disk_is_named(window, qtbot):
    from tests.ui.helpers import open_conversation

    chat = window.chat
    store = chat.controller.open_history().store
    conv = store.create_conversation("Qwen3.5-397B-A17B", None, {})
    open_conversation(window, qtbot, conv.id)
    assert chat.load_prompt.isVisibleTo(window) and not chat.load_prompt.load_button.isVisibleTo(window)
    assert "Qwen3.5-397B-A17B is not on this Mac" in chat.load_prompt.text.text()


def test_try_the_demo_model_makes_loads_and_labels_it(window, qtbot):
    with qtbot.waitSignal(window.chat.controller.model_ready, timeout=120_000):
        window.demo_action.trigger()
    ref = window.chat.controller.model_ref
    assert demo.is_demo_model(ref.local_path)
    assert window.chat.demo_note.isVisibleTo(window) and demo.SHORT_NOTICE in window.chat.demo_note.text()
    assert window.library.selected_row().local_path == ref.local_path


def test_the_undo_bar_keeps_the_window_within_its_size(chat, window, qtbot):
    from tests.ui.helpers import send

    send(chat, qtbot, "to be deleted", thinking=False)
    width = window.width()
    with qtbot.waitSignal(window.chat.controller.history_edited, timeout=60_000):  # deleted off the GUI thread
        window.delete_conversation(chat.controller.conversation_id, confirm=False)
    assert window.status.undo_button.isVisibleTo(window)
    qtbot.wait(50)
    assert window.width() == width and window.status.sizeHint().width() <= width
    window.undo_delete()
    assert window.status.budget_label.isVisibleTo(window) and window.status.app_label.isVisibleTo(window)


def test_picking_another_model_shows_the_details_from_their_top(library):
    details = library.details
    library.select("mlx-community/Qwen3.5-27B-4bit")
    bar = details.scroll.verticalScrollBar()
    bar.setValue(bar.maximum())
    assert bar.value() > 0  # the pane was scrolled down
    library.select("mlx-community/Qwen3.5-9B-4bit")
    assert bar.value() == 0
