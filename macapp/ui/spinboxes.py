"""Number boxes that take any number typed and clamp it into range visibly, instead of Qt's silent refusal.

Qt's spin boxes reject keystrokes that leave the range, so typing "50" into a 0–2 box keeps only "0" and the user
never learns why. These let the number be typed, set the nearest allowed value when editing ends, and emit
`clamped(typed, used)` so the form can say what happened.
"""

from __future__ import annotations

from typing import Protocol

from PySide6.QtCore import QLocale, Signal, SignalInstance
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import QDoubleSpinBox, QLineEdit, QSpinBox, QWidget

PARTIAL = ("", "-", "+", ".", ",", "-.", "+.")


class _ClampingBox(Protocol):
    """What the mixin's methods use of the box they are mixed into (its own members and the Qt spin box's)."""

    _typed: str | None

    @property
    def editingFinished(self) -> SignalInstance: ...
    @property
    def clamped(self) -> SignalInstance: ...
    def lineEdit(self) -> QLineEdit: ...
    def prefix(self) -> str: ...
    def suffix(self) -> str: ...
    def specialValueText(self) -> str: ...
    def locale(self) -> QLocale: ...
    def minimum(self) -> float: ...
    def maximum(self) -> float: ...
    def setValue(self, value: float, /) -> None: ...
    def _body(self, text: str) -> str: ...
    def _remember_typed(self, text: str) -> None: ...
    def _clamp_typed(self) -> None: ...


class _Clamping:
    """Shared by both boxes (a mixin before the Qt class): accept any number, clamp it at editingFinished."""

    _typed: str | None

    def _setup_clamping(self: _ClampingBox) -> None:
        self._typed = None
        self.lineEdit().textEdited.connect(self._remember_typed)
        self.editingFinished.connect(self._clamp_typed)

    def _body(self: _ClampingBox, text: str) -> str:
        return text.removeprefix(self.prefix()).removesuffix(self.suffix()).strip()

    def validate(self: _ClampingBox, text: str, pos: int) -> tuple[QValidator.State, str, int]:  # noqa: D102 - Qt override
        if self.specialValueText() and text == self.specialValueText():
            return QValidator.State.Acceptable, text, pos
        body = self._body(text)
        if body in PARTIAL:
            return QValidator.State.Intermediate, text, pos
        _value, ok = self.locale().toDouble(body)
        return (QValidator.State.Intermediate if ok else QValidator.State.Invalid), text, pos

    def _remember_typed(self: _ClampingBox, text: str) -> None:
        self._typed = text

    def _clamp_typed(self: _ClampingBox) -> None:
        typed, self._typed = self._typed, None
        if typed is None:
            return
        value, ok = self.locale().toDouble(self._body(typed))
        if not ok:
            return
        used = min(max(value, self.minimum()), self.maximum())
        if used != value:
            self.setValue(used)
            self.clamped.emit(self._body(typed), float(used))
        else:
            self.setValue(value)


class ClampingDoubleSpinBox(_Clamping, QDoubleSpinBox):
    clamped = Signal(str, float)  # what was typed, the value used instead

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._setup_clamping()


class ClampingSpinBox(_Clamping, QSpinBox):
    clamped = Signal(str, float)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._setup_clamping()

    def setValue(self, value: float) -> None:  # noqa: N802
        super().setValue(int(round(value)))
