"""The library's table: one row per catalog build (size, fit badge, speed, download state) and its badge painter."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QRectF, Qt
from PySide6.QtGui import QFont, QPainter
from PySide6.QtWidgets import QStyledItemDelegate, QStyleOptionViewItem, QWidget

from macapp.core import catalog
from macapp.core.fit import advice, prefill_time
from macapp.core.fit.estimate import Estimate
from macapp.core.hardware import MachineProfile
from macapp.core.hub.mtp import MtpStatus, status_for
from macapp.core.hub.record import records_stamp
from macapp.core.memory import format_bytes
from macapp.core.modelfiles import mtp_side_file
from macapp.ui.style import BADGE_TEXT, badge_colour
from macapp.ui.widgets import paint_pill

COLUMNS = ["Model", "Bits", "On disk", "Fit", "Est. speed", "Status"]
FIT_COL = 3


def short_context(tokens: int) -> str:
    """'32K' (K = 1,024, as contexts are quoted), '1.01M' for the card's decimal million (a column header's width)."""
    if tokens >= 1_000_000:
        return f"{tokens / 1_000_000:.2f}".rstrip("0").rstrip(".") + "M"
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else f"{tokens:,}"


def images_words(est: Estimate) -> str:
    """Whether a build accepts pictures, for the library and the details pane."""
    if est.accepts_images is False:
        return "Pictures: no — this build is text-only"
    if est.accepts_images is None:
        return "Pictures: not known until its files are read (File › Refresh Catalog from Hub, or download it)"
    if not est.vision_bytes:
        return "Pictures: yes (the memory they take is known once its files are read: File › Refresh Catalog from Hub, or download it)"
    return (
        f"Pictures: yes (the part that reads them takes {format_bytes(est.vision_bytes)}, "
        f"+{format_bytes(est.image_activation_bytes or 0)} while a full-size picture is read)"
    )


@dataclass
class Row:
    ref: catalog.ModelRef
    estimate: Estimate
    downloaded: bool = False
    local_path: Path | None = None
    advice: advice.Advice | None = None  # filled on demand by LibraryModel.advice_for

    @property
    def key(self) -> str:
        return self.ref.repo or str(self.ref.local_path)

    @property
    def title(self) -> str:
        return self.ref.name


class LibraryModel(QAbstractTableModel):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows: list[Row] = []
        self.context = 32768
        self.live_status: dict[str, str] = {}  # repo -> "Downloading 42%" while a download runs
        self.machine: MachineProfile | None = None
        self.loaded_path: Path | None = None  # the folder the chat has loaded: its row says "Loaded"

    def is_loaded(self, row: Row) -> bool:
        return self.loaded_path is not None and row.local_path is not None and Path(row.local_path) == self.loaded_path

    def set_loaded(self, path: Path | None) -> None:
        self.loaded_path = path
        if self.rows:
            self.dataChanged.emit(self.index(0, 0), self.index(len(self.rows) - 1, len(COLUMNS) - 1))

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> object:  # noqa: N802
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return f"Fit at {short_context(self.context)}" if section == FIT_COL else COLUMNS[section]
        return None

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        col = index.column()
        est = row.estimate
        if role == Qt.ItemDataRole.DisplayRole:
            if col == 0:
                return row.title
            if col == 1:
                return f"{row.ref.bits}-bit" if row.ref.bits else "bf16"  # as `qwen-desk fit` and the details say
            if col == 2:
                return format_bytes(est.weights_bytes)
            if col == FIT_COL:
                return BADGE_TEXT.get(est.verdict, est.verdict)
            if col == 4:
                return f"~{est.decode_tps_estimate:.0f} tok/s" if est.decode_tps_estimate else "—"
            if col == 5:
                if self.live_status.get(row.key):
                    return self.live_status[row.key]
                if self.is_loaded(row):
                    return "Loaded"
                if row.ref.origin is catalog.Origin.LOCAL:
                    return "Local folder"
                return "Downloaded" if row.downloaded else ""
        if role == Qt.ItemDataRole.ToolTipRole:
            if col == FIT_COL:
                return fit_tooltip(row, self.advice_for(row))
            if col == 0:
                return f"{row.ref.repo or row.ref.local_path}\n{images_words(est)}"
            if col == 5 and not row.downloaded:
                return "Not downloaded yet" if not catalog.hub_offline() else "Not downloaded (offline: downloads unavailable)"
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (2, 4):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.FontRole and (col == 0 or (col == 5 and self.is_loaded(row))):
            f = QFont()
            f.setWeight(QFont.Weight.DemiBold)
            return f
        if role == Qt.ItemDataRole.UserRole:
            return est.verdict
        return None

    def set_live_status(self, key: str, text: str) -> None:
        self.live_status[key] = text
        for i, row in enumerate(self.rows):
            if row.key == key:
                idx = self.index(i, 5)
                self.dataChanged.emit(idx, idx)

    def set_rows(self, rows: list[Row], context: int, machine: MachineProfile | None = None) -> None:
        self.beginResetModel()
        self.rows = rows
        self.context = context
        self.machine = machine  # the profile the rows were estimated for (for the advice)
        self.endResetModel()

    def advice_for(self, row: Row) -> advice.Advice:
        """The ways out for a row that does not fit (computed when first asked: tooltip or details)."""
        if row.advice is None:
            candidates = [r.ref for r in self.rows if r.ref.origin is catalog.Origin.CATALOG]
            row.advice = advice.advise(row.ref, row.estimate, self.machine, candidates) if self.machine else advice.Advice(row.estimate.verdict, "")
        return row.advice


_MTP_SEEN: dict[str, tuple[tuple[tuple[int, int], str, int], MtpStatus]] = {}  # row key -> (what it was read from, its MTP head)


def mtp_for(row: Row) -> MtpStatus:
    """Where the row's MTP head comes from (hub.mtp.MtpStatus), from local files and cached hub records only (never
    the network: fine on the GUI thread); read again only when the records or the side file changed."""
    side = mtp_side_file(row.local_path) if row.local_path is not None else None
    stamp = (records_stamp(), str(row.local_path), _mtime(side))
    hit = _MTP_SEEN.get(row.key)
    if hit is None or hit[0] != stamp:
        hit = (stamp, status_for(row.ref.repo, row.local_path))
        _MTP_SEEN[row.key] = hit
    return hit[1]


def _mtime(path: Path | None) -> int:
    try:
        return path.stat().st_mtime_ns if path is not None else 0
    except OSError:
        return 0


def fit_tooltip(row: Row, ways_out: advice.Advice) -> str:
    """The badge's tooltip: memory against the budget, the prompt-reading time, and the ways out when it does not fit."""
    est = row.estimate
    lines = [f"Needs {format_bytes(est.total_bytes)} of {format_bytes(est.budget_bytes)} GPU budget"]
    if est.ttft_estimate_s is not None:
        lines.append(f"Reading a {est.context:,}-token prompt: ~{prefill_time.format_duration(est.ttft_estimate_s)} (estimate)")
    lines += ways_out.lines()
    return "\n".join(lines)


class BadgeDelegate(QStyledItemDelegate):
    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> None:
        verdict = index.data(Qt.ItemDataRole.UserRole)
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.text = ""
        opt.widget.style().drawControl(opt.widget.style().ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        paint_pill(painter, QRectF(option.rect), index.data(), badge_colour(verdict), option.font)
