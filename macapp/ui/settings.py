"""The chat settings panel: sampling per thinking mode, max tokens, thinking budget, system prompt; reset to the card."""

from __future__ import annotations


from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from macapp.core.prompt_disk import SETTING as DISK_SETTING, SizeError, parse_size
from macapp.core.sampling import preset
from macapp.core.settings import Settings
from macapp.ui.spinboxes import ClampingDoubleSpinBox, ClampingSpinBox

# The ranges match macapp.core.sampling.SamplingParams.validate(): top_p in (0, 1], min_p in [0, 1).
FIELDS = [  # key, label, kind, minimum, maximum, step, tooltip
    ("temperature", "Temperature", float, 0.0, 2.0, 0.05, "Higher is more varied; 0 always picks the likeliest token"),
    ("top_p", "Top P", float, 0.01, 1.0, 0.05, "Sample only from the smallest set of tokens whose probabilities add up to this"),
    ("top_k", "Top K", int, 0, 1000, 1, "Sample only from the K likeliest tokens (0 = no limit)"),
    ("min_p", "Min P", float, 0.0, 0.99, 0.01, "Drop tokens less likely than this fraction of the likeliest one"),
    ("presence_penalty", "Presence penalty", float, 0.0, 2.0, 0.1, "Discourage repeating tokens already used (curbs endless loops)"),
]


def int_setting(settings: Settings, key: str, default: int) -> int:
    """A whole-number setting; `default` when it is not set, or not a number (a hand-edited settings file)."""
    value = settings.get(key, default)
    return int(value) if isinstance(value, (int, float)) else default


def text_setting(settings: Settings, key: str) -> str:
    """A text setting; "" when it is not set, or not text (a hand-edited settings file)."""
    value = settings.get(key, "")
    return value if isinstance(value, str) else ""


def _number(value: object) -> float | None:
    """A sampling value as the panel holds it: a number, None (not set) for anything else."""
    return value if isinstance(value, (int, float)) else None


def card_presets(thinking: bool) -> dict[str, float | None]:
    """The model card's sampling values for a mode (macapp.core.sampling), as the panel shows them."""
    card = preset(thinking).to_dict()
    values = {key: _number(card[key]) for key, *_rest in FIELDS}
    values["max_tokens"] = _number(card["max_tokens"])
    values["thinking_budget"] = None
    return values


def mode_key(thinking: bool) -> str:
    return "chat.sampling.thinking" if thinking else "chat.sampling.instant"


def sampling_for(settings: Settings, thinking: bool) -> dict[str, float | None]:
    """The user's sampling values for a mode: the card's presets with the user's changes on top."""
    values = card_presets(thinking)
    changed = settings.get(mode_key(thinking), {})
    if isinstance(changed, dict):  # numbers and None, as the panel stores them; other values (a hand-edited file) are left out
        values.update({key: value for key, value in changed.items() if value is None or isinstance(value, (int, float))})
    return values


class SettingsDialog(QDialog):
    """Edits the values of the current thinking mode (each mode keeps its own) and the system prompt."""

    changed = Signal()

    def __init__(self, settings: Settings, thinking: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("SettingsDialog")
        self.settings = settings
        self.thinking = thinking
        self.setWindowTitle("Chat Settings")
        self.setMinimumWidth(440)
        self.mode_label = QLabel(self)
        self.mode_label.setObjectName("Muted")
        self.mode_label.setWordWrap(True)
        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignmentFlag.AlignRight)
        self.inputs: dict[str, ClampingSpinBox | ClampingDoubleSpinBox] = {}
        for key, label, kind, lo, hi, step, tip in FIELDS:
            box: ClampingDoubleSpinBox | ClampingSpinBox
            if kind is float:
                box = ClampingDoubleSpinBox(self)
                box.setRange(lo, hi)
                box.setSingleStep(step)
                box.setDecimals(2)
            else:  # top_k: its figures are whole numbers
                box = ClampingSpinBox(self)
                box.setRange(int(lo), int(hi))
                box.setSingleStep(int(step))
            box.clamped.connect(lambda typed, used, name=label, b=box: self._say_clamped(name, b, typed, used))
            box.setToolTip(tip)
            form.addRow(label, box)
            self.inputs[key] = box
        self.max_tokens = ClampingSpinBox(self)
        self.max_tokens.clamped.connect(lambda t, u: self._say_clamped("Max tokens", self.max_tokens, t, u))
        self.max_tokens.setRange(16, 262_144)
        self.max_tokens.setSingleStep(512)
        self.max_tokens.setGroupSeparatorShown(True)
        self.max_tokens.setToolTip("The longest reply, reasoning included")
        form.addRow("Max tokens", self.max_tokens)
        self.thinking_budget = ClampingSpinBox(self)
        self.thinking_budget.clamped.connect(lambda t, u: self._say_clamped("Thinking budget", self.thinking_budget, t, u))
        self.thinking_budget.setRange(0, 262_144)
        self.thinking_budget.setSingleStep(512)
        self.thinking_budget.setGroupSeparatorShown(True)
        self.thinking_budget.setSpecialValueText("No limit")
        self.thinking_budget.setToolTip("Stop reasoning after this many tokens and make the model answer (0 = no limit)")
        form.addRow("Thinking budget", self.thinking_budget)
        self.system_prompt = QPlainTextEdit(self)
        self.system_prompt.setPlaceholderText("Optional instructions for every new chat, e.g. “Answer briefly.”")
        self.system_prompt.setFixedHeight(90)
        form.addRow("System prompt", self.system_prompt)
        self.prompt_disk = QLineEdit(self)
        self.prompt_disk.setPlaceholderText("Default (20 GB or a tenth of the free disk)")
        self.prompt_disk.setToolTip(
            "Disk kept for prompt checkpoints, so reopened chats and agent sessions read only what is new: "
            "a size like 20GB or 512MB, 0 for none. From the next start; `qwen-desk cache --clear` empties it"
        )
        form.addRow("Prompt cache on disk", self.prompt_disk)

        self.reset_button = QPushButton("Reset to the Card's Values", self)
        self.reset_button.clicked.connect(self.reset_to_card)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self)
        buttons.addButton(self.reset_button, QDialogButtonBox.ButtonRole.ResetRole)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(self.mode_label)
        lay.addLayout(form)
        self.range_note = QLabel(self)  # says when a typed value was out of range and what was used instead
        self.range_note.setObjectName("Warning")
        self.range_note.setWordWrap(True)
        self.range_note.hide()
        self._just_clamped = False
        lay.addWidget(self.range_note)
        lay.addWidget(buttons)
        self.load_values()

    def _say_clamped(self, name: str, box: ClampingSpinBox | ClampingDoubleSpinBox, typed: str, used: float) -> None:
        if isinstance(box, ClampingSpinBox):  # it clamps to its ends, whole numbers: int() is what Qt's int argument made of them
            lo, hi, used_text = box.textFromValue(box.minimum()), box.textFromValue(box.maximum()), box.textFromValue(int(used))
        else:
            lo, hi, used_text = box.textFromValue(box.minimum()), box.textFromValue(box.maximum()), box.textFromValue(used)
        self.range_note.setText(f"{name} goes from {lo} to {hi}: {typed} was set to {used_text}.")
        self.range_note.show()
        self._just_clamped = True  # an Enter that clamped keeps the panel open, so the note is seen

    def load_values(self) -> None:
        mode = "thinking" if self.thinking else "non-thinking"
        self.mode_label.setText(f"Sampling for <b>{mode}</b> mode (each mode keeps its own values; switch with the Thinking toggle).")
        self._show(sampling_for(self.settings, self.thinking))
        self.system_prompt.setPlainText(text_setting(self.settings, "chat.system_prompt"))
        self.prompt_disk.setText(text_setting(self.settings, DISK_SETTING))

    def _show(self, values: dict[str, float | None]) -> None:
        for key, box in self.inputs.items():
            box.setValue(values.get(key, 0) or 0)
        self.max_tokens.setValue(int(values.get("max_tokens", 8192) or 8192))
        self.thinking_budget.setValue(int(values.get("thinking_budget") or 0))

    def values(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {k: box.value() for k, box in self.inputs.items()}
        out["max_tokens"] = self.max_tokens.value()
        out["thinking_budget"] = self.thinking_budget.value() or None
        return out

    def reset_to_card(self) -> None:
        self._show(card_presets(self.thinking))

    def accept(self) -> None:
        if self._just_clamped:
            self._just_clamped = False
            return
        disk = self.prompt_disk.text().strip()
        try:
            parse_size(disk or "0")
        except SizeError as exc:
            self.range_note.setText(f"Prompt cache on disk: {exc}.")
            self.range_note.show()
            return
        values = self.values()
        card = card_presets(self.thinking)
        # Store only what differs from the card, so a later card update still reaches untouched values.
        self.settings.set(mode_key(self.thinking), {k: v for k, v in values.items() if card.get(k) != v})
        self.settings.set("chat.system_prompt", self.system_prompt.toPlainText().strip())
        self.settings.set(DISK_SETTING, disk)
        self.changed.emit()
        super().accept()
