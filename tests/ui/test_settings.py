import pytest

from macapp.core.sampling import preset
from macapp.ui.settings import SettingsDialog, sampling_for


def test_reset_to_the_cards_values_and_only_changes_are_stored(qtbot, settings):
    dialog = SettingsDialog(settings, thinking=True)
    qtbot.addWidget(dialog)
    card = preset(True)
    assert dialog.inputs["temperature"].value() == card.temperature
    assert dialog.max_tokens.value() == card.max_tokens
    dialog.inputs["temperature"].setValue(0.3)
    dialog.thinking_budget.setValue(2048)
    dialog.system_prompt.setPlainText("Answer briefly.")
    dialog.accept()
    assert settings.get("chat.sampling.thinking") == {"temperature": 0.3, "thinking_budget": 2048}
    assert settings.get("chat.system_prompt") == "Answer briefly."
    values = sampling_for(settings, thinking=True)
    assert values["temperature"] == 0.3 and values["top_p"] == card.top_p
    # The other mode keeps the card's own values.
    assert sampling_for(settings, thinking=False)["temperature"] == preset(False).temperature

    again = SettingsDialog(settings, thinking=True)
    qtbot.addWidget(again)
    assert again.inputs["temperature"].value() == 0.3
    again.reset_button.click()
    assert again.inputs["temperature"].value() == card.temperature
    assert again.thinking_budget.value() == 0 and again.thinking_budget.text() == "No limit"
    again.accept()
    assert settings.get("chat.sampling.thinking") == {}


def test_preferences_shortcut_opens_the_settings(window, qtbot):
    assert window.preferences_action.shortcut().toString() in ("Ctrl+,", "Meta+,")
    window.preferences_action.trigger()
    qtbot.waitUntil(lambda: window.chat.settings_dialog.isVisible(), timeout=60_000)
    window.chat.settings_dialog.reject()


def test_the_panel_cannot_hold_values_the_sampler_refuses(qtbot, settings):
    dialog = SettingsDialog(settings, thinking=False)
    qtbot.addWidget(dialog)
    dialog.inputs["top_p"].setValue(0.0)
    dialog.inputs["min_p"].setValue(1.0)
    values = dialog.values()
    assert values["top_p"] > 0 and values["min_p"] < 1
    preset(False).with_overrides(top_p=values["top_p"], min_p=values["min_p"]).validate()  # raises if refused
    with pytest.raises(ValueError):  # what the panel keeps out: the values typed in are refused by the sampler
        preset(False).with_overrides(top_p=0.0, min_p=1.0).validate()


@pytest.mark.parametrize("typed, expected", [("50", 2.0), ("-3", 0.0), ("1.5", 1.5)])
def test_an_out_of_range_temperature_is_clamped_and_the_panel_says_so(qtbot, settings, typed, expected):
    from PySide6.QtCore import Qt

    dialog = SettingsDialog(settings, thinking=False)
    qtbot.addWidget(dialog)
    dialog.show()
    box = dialog.inputs["temperature"]
    box.lineEdit().selectAll()
    qtbot.keyClicks(box.lineEdit(), typed)
    qtbot.keyClick(box.lineEdit(), Qt.Key.Key_Return)
    assert box.value() == expected
    assert box.text() == f"{expected:.2f}"  # what is used is what is shown
    if expected == float(typed):
        assert not dialog.isVisible()  # Enter accepted the panel
        assert settings.get("chat.sampling.instant")["temperature"] == expected
    else:  # the Enter that clamped keeps the panel open on the note; the next one accepts
        assert dialog.isVisible() and dialog.range_note.isVisible()
        assert dialog.range_note.text() == f"Temperature goes from 0.00 to 2.00: {typed} was set to {expected:.2f}."
        qtbot.keyClick(box.lineEdit(), Qt.Key.Key_Return)
        assert not dialog.isVisible()
        assert settings.get("chat.sampling.instant")["temperature"] == expected


def test_a_thinking_budget_box_still_takes_its_no_limit_text(qtbot, settings):
    from PySide6.QtCore import Qt

    dialog = SettingsDialog(settings, thinking=True)
    qtbot.addWidget(dialog)
    dialog.show()
    box = dialog.thinking_budget
    box.lineEdit().selectAll()
    qtbot.keyClicks(box.lineEdit(), "999999")
    qtbot.keyClick(box.lineEdit(), Qt.Key.Key_Return)
    assert box.value() == 262_144
    assert dialog.range_note.text() == "Thinking budget goes from 0 to 262,144: 999999 was set to 262,144."
    box.setValue(0)
    assert box.text() == "No limit" and box.value() == 0


def test_the_prompt_cache_size_is_a_setting_the_chat_and_server_share(qtbot, settings, tmp_path):
    """Settings' "Prompt cache on disk" takes a size as --prompt-cache-disk does (a bad one is refused, saying how
    to write it); the window's engine then gives its chat sessions, and its server, one store of that size."""
    from macapp.core.prompt_disk import SETTING, prompts_dir
    from macapp.ui.chat_controller import ChatController

    dialog = SettingsDialog(settings, thinking=True)
    qtbot.addWidget(dialog)
    assert dialog.prompt_disk.text() == "" and "20 GB" in dialog.prompt_disk.placeholderText()
    dialog.prompt_disk.setText("lots")
    dialog.accept()
    assert "write it like 20GB" in dialog.range_note.text() and settings.get(SETTING) is None  # refused, the panel stays
    dialog.prompt_disk.setText("8MB")
    dialog.accept()
    assert settings.get(SETTING) == "8MB"
    controller = ChatController(settings)
    try:
        engine = controller._ensure_engine()
        assert controller.prompt_disk is not None and controller.prompt_disk.max_bytes == 8_000_000
        assert controller.prompt_disk.root == prompts_dir() and engine.position_shelf is not None
    finally:
        controller.shutdown()
    settings.set(SETTING, "0")
    off = ChatController(settings)
    try:
        assert off._ensure_engine().position_shelf is None and off.prompt_disk.max_bytes == 0
    finally:
        off.shutdown()
