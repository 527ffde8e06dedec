"""The Chat page's model controls: the model picker in its header, and the prompt shown while no model is loaded.

Both only say what the user can do and emit what they chose; the main window loads through the library, so the
fit guardrail ("does not fit: Load anyway?") applies whichever way a model is picked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

PLACEHOLDER = "Choose a model…"


@dataclass(frozen=True)
class Choice:
    """One model the picker offers: a library row that is on disk."""

    key: str  # the library row's key
    label: str
    path: Path
    name: str  # the model's name as the history records it


class ModelPicker(QComboBox):
    """Models on this machine; picking one emits `chosen(key)` (the window loads it). Shows the loaded one."""

    chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("ModelPicker")
        self.setToolTip("Models on this Mac: pick one to load it (downloads and folders are added in Models)")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.choices: list[Choice] = []
        self.loaded: Path | None = None
        self.activated.connect(self._activated)
        self._fill()

    def set_choices(self, choices: list[Choice], loaded: Path | None) -> None:
        if (list(choices), loaded) == (self.choices, self.loaded):
            return  # called on every state change of the chat: refill only when something changed
        self.choices, self.loaded = list(choices), loaded
        self._fill()

    def set_loaded(self, loaded: Path | None) -> None:
        self.loaded = loaded
        self._fill()

    def _fill(self) -> None:
        self.blockSignals(True)
        self.clear()
        self.addItem(PLACEHOLDER if self.choices else "No models on this Mac yet", None)
        current = 0
        for i, choice in enumerate(self.choices, start=1):
            self.addItem(choice.label, choice.key)
            if self.loaded is not None and choice.path == self.loaded:
                current = i
        self.setCurrentIndex(current)
        self.setEnabled(bool(self.choices))
        self.blockSignals(False)

    def _activated(self, index: int) -> None:
        key = self.itemData(index)
        if key is None:
            return
        choice = self.choices[index - 1]
        if choice.path != self.loaded:
            self.chosen.emit(key)


class LoadPrompt(QFrame):
    """Shown instead of a silent, disabled Send while no model is loaded: why, and the ways to load one."""

    load_requested = Signal(str)  # a library row's key: the open conversation's own model
    models_requested = Signal()
    demo_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("LoadPrompt")
        self.text = QLabel(self)
        self.text.setObjectName("LoadPromptText")
        self.text.setWordWrap(True)
        self.load_button = QPushButton(self)
        self.load_button.setObjectName("Primary")
        self.models_button = QPushButton("Choose a Model…", self)
        self.demo_button = QPushButton("Try the Demo Model", self)
        self.demo_button.setToolTip("A tiny model made here in a second: it gives the same reply to anything, it only shows the app working")
        self._key: str | None = None
        self.load_button.clicked.connect(lambda: self._key and self.load_requested.emit(self._key))
        self.models_button.clicked.connect(self.models_requested)
        self.demo_button.clicked.connect(self.demo_requested)
        buttons = QHBoxLayout()
        buttons.setContentsMargins(0, 0, 0, 0)
        buttons.addWidget(self.load_button)
        buttons.addWidget(self.models_button)
        buttons.addWidget(self.demo_button)
        buttons.addStretch(1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 8, 12, 8)
        lay.setSpacing(6)
        lay.addWidget(self.text)
        lay.addLayout(buttons)

    def show_for(self, conversation_model: str | None, own: Choice | None) -> None:
        """No model loaded: say so, offering the open conversation's own model when it is on this Mac."""
        self._key = own.key if own is not None else None
        if conversation_model:
            where = "" if own is not None else f" ({conversation_model} is not on this Mac: choose another or download it)"
            self.text.setText(f"<b>Load a model to continue</b> this conversation{where}.")
        else:
            self.text.setText("<b>Load a model to start chatting</b>: choose one you have, or try the demo model first.")
        self.load_button.setVisible(own is not None)
        if own is not None:
            self.load_button.setText(f"Load {own.label}")
        self.show()
