"""Look and feel: platform style on macOS, Fusion elsewhere; palette-driven so light/dark follows the system."""

from __future__ import annotations

import os
import sys

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from macapp.core.paths import resources_dir

# Fit badge colours (light, dark): white text on these reads well on both backgrounds.
BADGE_COLOURS = {
    "fits": ("#248A3D", "#248A3D"),
    "tight": ("#C93400", "#C25E00"),
    "too_big": ("#D70015", "#D70015"),
}
BADGE_TEXT = {"fits": "Fits", "tight": "Tight", "too_big": "Too big"}
BAR_COLOURS = {  # stacked memory bar: weights, KV cache, DeltaNet state, overhead
    "weights": "#0A84FF",
    "kv": "#BF5AF2",
    "state": "#FF9F0A",
    "overhead": "#8E8E93",
}


def is_dark() -> bool:
    forced = os.environ.get("QWEN_DESK_APPEARANCE", "").lower()  # "dark" / "light": for screenshots and checks
    if forced in ("dark", "light"):
        return forced == "dark"
    hints = QGuiApplication.styleHints()
    scheme = hints.colorScheme() if hasattr(hints, "colorScheme") else Qt.ColorScheme.Unknown
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    return QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() < 128


def badge_colour(verdict: str) -> QColor:
    light, dark = BADGE_COLOURS.get(verdict, ("#8E8E93", "#8E8E93"))
    return QColor(dark if is_dark() else light)


def _mac_like_palette(dark: bool) -> QPalette:
    """Fusion palette close to macOS's system colours (used off macOS, e.g. for screenshots on Linux)."""
    p = QPalette()
    if dark:
        window, base, alt, text, mid, midlight = "#1E1E1E", "#282828", "#323232", "#E6E6E6", "#4A4A4A", "#3A3A3A"
        placeholder = "#9A9A9A"
    else:
        window, base, alt, text, mid, midlight = "#F2F2F4", "#FFFFFF", "#F0F0F3", "#1D1D1F", "#C6C6C8", "#DEDEE2"
        placeholder = "#6E6E73"
    role = QPalette.ColorRole
    for r, c in (
        (role.Window, window),
        (role.Base, base),
        (role.AlternateBase, alt),
        (role.Text, text),
        (role.WindowText, text),
        (role.ButtonText, text),
        (role.Button, base),
        (role.Mid, mid),
        (role.Midlight, midlight),
        (role.Light, base),
        (role.Dark, mid),
        (role.PlaceholderText, placeholder),
        (role.ToolTipBase, base),
        (role.ToolTipText, text),
        (role.Highlight, "#0A84FF" if dark else "#007AFF"),
        (role.HighlightedText, "#FFFFFF"),
        (role.Link, "#0A84FF" if dark else "#0066CC"),
    ):
        p.setColor(r, QColor(c))
    p.setColor(QPalette.ColorGroup.Disabled, role.Text, QColor(placeholder))
    p.setColor(QPalette.ColorGroup.Disabled, role.ButtonText, QColor(placeholder))
    return p


def apply_style(app: QApplication) -> None:
    if sys.platform != "darwin" or os.environ.get("QWEN_DESK_APPEARANCE"):
        app.setStyle("Fusion")
        app.setPalette(_mac_like_palette(is_dark()))
        font = app.font()
        font.setPointSizeF(max(font.pointSizeF(), 10.0))
        app.setFont(font)
    qss = resources_dir() / "style.qss"
    if qss.is_file():
        app.setStyleSheet(qss.read_text(encoding="utf-8"))


def follow_system_appearance(app: QApplication) -> None:
    """Re-apply the palette when the system switches light/dark (macOS repaints its own palette)."""
    hints = QGuiApplication.styleHints()
    if hasattr(hints, "colorSchemeChanged") and sys.platform != "darwin":
        hints.colorSchemeChanged.connect(lambda _scheme: apply_style(app))
