"""Details of one build: memory bar (weights / KV cache / DeltaNet state / overhead) vs the GPU budget, max context, speed."""

from __future__ import annotations

import html
import re

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QFrame, QGridLayout, QHBoxLayout, QLabel, QPushButton, QScrollArea, QVBoxLayout, QWidget

from macapp.core.fit.cluster import hosts_needed
from macapp.core.fit.prefill_time import format_duration
from macapp.core.fit.estimate import Estimate
from macapp.core.hardware import MachineProfile
from macapp.core.hub.mtp import MtpStatus, MtpWhere
from macapp.core.long_context import notice
from macapp.core.memory import format_bytes
from macapp.ui.downloads import DownloadPanel
from macapp.ui.library_model import Row, images_words, mtp_for
from macapp.ui.style import BAR_COLOURS
from macapp.ui.widgets import Badge, ElidedLabel, StackedBar

# The pane speaks plain words; the technical names (as `qwen-desk fit` and the derivation below use them) are in
# the tooltips.
SEGMENTS = [
    ("weights", "Weights", "weights_bytes", "The model's parameters"),
    ("kv", "KV cache", "kv_cache_bytes", "What the model keeps of the conversation: grows with the context"),
    ("state", "Running state", "state_bytes", "The linear-attention (Gated DeltaNet) layers' state: the same size at any context"),
    ("overhead", "Overhead", "overhead_bytes", "Reading one chunk of the prompt, and the runtime"),
]
MTP_TIP = "Multi-token prediction (MTP): a small extra part of the model drafts the next words, which the model checks in one step"


def mtp_words(status: MtpStatus, repo: str | None = None) -> str:
    """Whether replies can come faster with the build's MTP head (drafting), in plain words."""
    match status.where:
        case MtpWhere.IN_BUILD:
            return f"Faster replies: yes (a {format_bytes(status.head_bytes)} part in the build drafts several words at a time)"
        case MtpWhere.FETCHED:
            return f"Faster replies: yes (a {format_bytes(status.head_bytes)} part fetched beside the build drafts several words at a time)"
        case MtpWhere.TO_FETCH:
            how = f": <code>qwen-desk download {html.escape(repo)} --mtp</code>" if repo else ""
            return (
                f"Faster replies: possible with a {format_bytes(status.fetch_bytes)} part to fetch from "
                f"{html.escape(status.source_repo or '')} (about {format_bytes(status.head_bytes)} in memory){how}"
            )
        case MtpWhere.NONE:
            return f"Faster replies: not for this build ({html.escape(status.note)})" if status.note else "Faster replies: not for this build"
    return "Faster replies: not known yet (File › Refresh Catalog from Hub, or download the build)"


def _unbroken(text: str) -> str:
    """'8 min 44 s' kept on one line (a wrapped label split it as '8 min 44' / 's')."""
    return text.replace(" ", "\u00a0")


def advice_html(lines: list[str]) -> str:
    """The ways out as the label shows them: the headline, then one step a line, `commands` in a code
    font (the same lines as `qwen-desk fit` prints; plain spaces, so a selected command pastes into Terminal)."""

    def line_html(line: str) -> str:
        return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(line, quote=False))

    if not lines:
        return ""
    head, *steps = (line_html(line) for line in lines)
    return f"<p style='margin:0 0 4px 0'>{head}</p>" + "<br>".join(steps)


def _swatch(colour: str) -> QLabel:
    sw = QLabel()
    sw.setFixedSize(10, 10)
    sw.setStyleSheet(f"background: {colour}; border-radius: 3px;")
    return sw


class DetailsPanel(QFrame):
    load_clicked = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Card")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.setMinimumWidth(280)
        self.title = QLabel(self)
        self.title.setObjectName("DetailsTitle")
        self.title.setWordWrap(True)
        self.repo = ElidedLabel("", self)
        self.repo.setObjectName("Muted")
        self.badge = Badge("", self)
        self.total = QLabel(self)
        self.total.setWordWrap(True)
        self.bar = StackedBar(self)
        self.budget_note = QLabel(self)
        self.budget_note.setObjectName("Muted")

        legend = QGridLayout()
        legend.setHorizontalSpacing(8)
        legend.setVerticalSpacing(2)
        self.legend_values: dict[str, QLabel] = {}
        for i, (key, label, _attr, tip) in enumerate(SEGMENTS):
            legend.addWidget(_swatch(BAR_COLOURS[key]), i, 0)
            name = QLabel(label, self)
            name.setToolTip(tip)
            legend.addWidget(name, i, 1)
            value = QLabel(self)
            value.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            legend.addWidget(value, i, 2)
            self.legend_values[key] = value
        legend.setColumnStretch(1, 1)

        self.max_context = QLabel(self)
        self.max_context.setWordWrap(True)
        self.long_context = QLabel(self)  # past the native length: the model loads in long-context mode (YaRN)
        self.long_context.setObjectName("Warning")
        self.long_context.setWordWrap(True)
        self.speed = QLabel(self)
        self.speed.setWordWrap(True)
        self.reading = QLabel(self)
        self.reading.setWordWrap(True)
        self.pictures = QLabel(self)  # whether the build accepts images, and what they cost
        self.pictures.setWordWrap(True)
        self.mtp = QLabel(self)  # the MTP head: in the build, fetched, so much to fetch, or none
        self.mtp.setWordWrap(True)
        self.mtp.setTextFormat(Qt.TextFormat.RichText)
        self.mtp.setToolTip(MTP_TIP)
        self.advice = QLabel(self)
        self.advice.setObjectName("Advice")
        self.advice.setWordWrap(True)
        self.advice.setTextFormat(Qt.TextFormat.RichText)
        self.advice.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # the sysctl command can be copied
        self.cluster_note = QLabel(self)  # for a build too big for this Mac: how many such Macs it needs
        self.cluster_note.setWordWrap(True)
        self.derivation = QLabel(self)
        self.derivation.setObjectName("Derivation")
        self.derivation.setWordWrap(True)
        self.derivation.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.load_button = QPushButton("Load", self)
        self.load_button.setObjectName("Primary")
        self.load_button.clicked.connect(self.load_clicked)
        self.download_panel = DownloadPanel(self)

        head = QHBoxLayout()
        head.addWidget(self.badge, 0, Qt.AlignmentFlag.AlignVCenter)
        head.addWidget(self.total, 1)
        self.buttons = QHBoxLayout()  # the selected build's actions (the library adds its own beside Load)
        self.buttons.addStretch(1)
        self.buttons.addWidget(self.load_button)

        self.empty = QLabel("Select a model to see how it fits this Mac.", self)
        self.empty.setObjectName("Note")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)

        # The figures scroll if the window is short; the download panel and Load stay in view.
        self.body = QWidget(self)
        info = QWidget()
        body = QVBoxLayout(info)
        body.setContentsMargins(0, 0, 6, 0)
        body.setSpacing(8)
        scroll = QScrollArea(self.body)
        self.scroll_area = scroll
        self.scroll = scroll  # type: ignore[method-assign, assignment]  # the tests' name: it hides QWidget.scroll(dx, dy), unused here
        scroll.setWidget(info)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        info.setMinimumWidth(0)
        self.bar.setMinimumWidth(0)
        scroll.viewport().setAutoFillBackground(False)
        info.setAutoFillBackground(False)
        outer = QVBoxLayout(self.body)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(8)
        outer.addWidget(scroll, 1)
        body.addWidget(self.title)
        body.addWidget(self.repo)
        body.addLayout(head)
        body.addWidget(self.bar)
        body.addWidget(self.budget_note)
        body.addWidget(self.advice)  # the ways out under the verdict and its bar, in view without scrolling
        body.addWidget(self.cluster_note)
        body.addLayout(legend)
        body.addSpacing(4)
        body.addWidget(self.max_context)
        body.addWidget(self.long_context)
        body.addWidget(self.speed)
        body.addWidget(self.reading)
        body.addWidget(self.pictures)
        body.addWidget(self.mtp)
        body.addWidget(self.derivation)
        body.addStretch(1)
        outer.addWidget(self.download_panel)
        outer.addLayout(self.buttons)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(16, 14, 16, 14)
        lay.addWidget(self.empty)
        lay.addWidget(self.body)
        self.show_row(None, None, 0, None)

    def show_row(self, row: Row | None, machine: MachineProfile | None, context: int, kv_bits: int | None) -> None:
        previous = getattr(self, "row", None)
        self.row = row
        if row is not None and (previous is None or previous.key != row.key):
            self.scroll_area.verticalScrollBar().setValue(0)  # another model: start at its header, not mid-way down
        self.empty.setVisible(row is None)
        self.body.setVisible(row is not None)
        if row is None:
            return
        est = row.estimate
        ref = row.ref
        bits = f"{ref.bits}-bit" if ref.bits else "bf16"  # unquantized, sized as bf16 (the library, `qwen-desk fit`)
        self.title.setText(ref.name)
        self.repo.setText(f"{bits} · {ref.repo or ref.local_path}")
        self.badge.set_verdict(est.verdict)
        kv = f", {kv_bits}-bit KV cache" if kv_bits else ""
        self.total.setText(
            f"Needs <b>{format_bytes(est.total_bytes)}</b> of this Mac's {format_bytes(est.budget_bytes)} GPU budget "
            f"at {est.context:,} tokens{kv}"  # the context it was sized at: a model's own maximum if that is shorter
        )
        self._show_long_context(est)
        segments = [(label, float(getattr(est, attr) or 0), QColor(BAR_COLOURS[key])) for key, label, attr, _tip in SEGMENTS]
        self.bar.set_values(segments, float(est.budget_bytes))
        self.bar.setToolTip(" · ".join(f"{label} {format_bytes(v)}" for label, v, _c in segments))
        self.budget_note.setText("The line marks the GPU budget")
        for key, _label, attr, _tip in SEGMENTS:
            self.legend_values[key].setText(format_bytes(getattr(est, attr) or 0))
        if est.max_context and est.max_context > 0:
            cap = " (the model's maximum)" if est.max_context >= ref.arch.max_position_embeddings else ""
            self.max_context.setText(f"Largest context that fits: <b>{est.max_context:,} tokens</b>{cap}")
        else:
            self.max_context.setText("Largest context that fits: <b>none</b> — the weights alone exceed the budget")
        if est.decode_tps_estimate:
            self.speed.setText(f"Estimated speed: <b>~{est.decode_tps_estimate:.0f} tok/s</b> when generating")
        else:
            self.speed.setText("Estimated speed: unknown on this machine (no Apple GPU bandwidth figure)")
        self._show_reading_and_advice(row)
        self.pictures.setText(images_words(est))
        self.mtp.setText(mtp_words(mtp_for(row), ref.repo))
        self._show_cluster_note(row, machine, context, kv_bits)
        self.derivation.setText("How this is worked out:\n" + "\n".join(f"• {line}" for line in est.derivation))
        downloaded = row.local_path is not None
        self.load_button.setEnabled(downloaded)
        self.load_button.setText("Load" if est.verdict != "too_big" else "Load…")
        self.load_button.setToolTip("" if downloaded else "Download the model first")

    def _show_long_context(self, est: Estimate) -> None:
        """Past the model's native length it loads in long-context mode (YaRN: named in the tooltip, as `qwen-desk
        chat` says it)."""
        factor = est.yarn_factor
        self.long_context.setVisible(bool(factor))
        if factor:
            native = est.native_context
            past = f"{est.context:,} tokens is past the {native:,} it was trained on" if native else "past the length it was trained on"
            self.long_context.setText(
                f"Loads in long-context mode: {past}, so its position encoding is stretched {factor}×; "
                "the model card notes this can lower quality on short texts"
            )
            self.long_context.setToolTip(notice(factor))

    def _show_reading_and_advice(self, row: Row) -> None:
        est = row.estimate
        if est.ttft_estimate_s is not None:
            self.reading.setText(
                f"Reading a {est.context:,}-token prompt: <b>~{_unbroken(format_duration(est.ttft_estimate_s))}</b> before the first word "
                f"(~{est.prefill_tps_estimate:,.0f} tok/s, estimated)"
            )
        else:
            self.reading.setText("Prompt reading time: unknown on this machine (no Apple GPU figure)")
        lines = row.advice.lines() if row.advice is not None else []
        self.advice.setVisible(bool(lines))
        self.advice.setText(advice_html(lines))

    def _show_cluster_note(self, row: Row, machine: MachineProfile | None, context: int, kv_bits: int | None) -> None:
        too_big = row.estimate.verdict == "too_big" and machine is not None
        needed = hosts_needed(row.ref, context, machine, kv_bits) if too_big and machine is not None else None
        self.cluster_note.setVisible(too_big)
        if needed is not None:
            self.cluster_note.setText(
                f"Too big for one such Mac: <b>{needed} of them</b>, linked together, hold it at {context:,} tokens "
                f"(<code>qwen-desk fit --hosts {needed}</code> shows how it is shared)"
            )
        elif too_big:
            self.cluster_note.setText("Too big even for eight such Macs at this context")
