"""The download panel: progress bar, speed, ETA, stall warning, pause/resume/cancel, readable errors with the fix."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QMessageBox, QProgressBar, QPushButton, QVBoxLayout, QWidget

from macapp.core.catalog import Origin, hub_offline
from macapp.core.download import delete_model, inspect_repo, manager
from macapp.core.catalog import ModelRef
from macapp.core.download import events as ev
from macapp.core.hub.errors import DownloadError, DownloadErrorKind
from macapp.core.download.job import DownloadJob, JobState
from macapp.core.hub.settings import hub_reachable, hub_settings
from macapp.core.memory import format_bytes
from macapp.ui.bridge import EventBridge
from macapp.ui.library_model import Row


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(seconds)
    if seconds < 60:
        return f"about {max(seconds, 1)} s left"
    if seconds < 3600:
        return f"about {round(seconds / 60)} min left"
    return f"about {seconds // 3600} h {seconds % 3600 // 60:02d} min left"


class DownloadPanel(QFrame):
    """Shows one download's state; its buttons emit requests the controller acts on."""

    start_clicked = Signal()
    pause_clicked = Signal()
    resume_clicked = Signal()
    cancel_clicked = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.headline = QLabel(self)
        self.headline.setWordWrap(True)
        self.progress = QProgressBar(self)
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.setFixedHeight(8)
        self.detail = QLabel(self)
        self.detail.setObjectName("Muted")
        self.warning = QLabel(self)
        self.warning.setObjectName("Warning")
        self.warning.setWordWrap(True)
        self.error = QLabel(self)
        self.error.setObjectName("Error")
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.download_button = QPushButton("Download", self)
        self.pause_button = QPushButton("Pause", self)
        self.resume_button = QPushButton("Resume", self)
        self.cancel_button = QPushButton("Cancel", self)
        self.download_button.clicked.connect(self.start_clicked)
        self.pause_button.clicked.connect(self.pause_clicked)
        self.resume_button.clicked.connect(self.resume_clicked)
        self.cancel_button.clicked.connect(self.cancel_clicked)
        buttons = QHBoxLayout()
        buttons.setContentsMargins(0, 0, 0, 0)
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.resume_button)
        buttons.addWidget(self.pause_button)
        buttons.addWidget(self.cancel_button)
        buttons.addStretch(1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 6, 0, 6)
        lay.setSpacing(4)
        for w in (self.headline, self.progress, self.detail, self.warning, self.error):
            lay.addWidget(w)
        lay.addLayout(buttons)
        self.updates = 0
        self.set_idle("", downloadable=False)

    def _buttons(self, download: bool = False, pause: bool = False, resume: bool = False, cancel: bool = False) -> None:
        self.download_button.setVisible(download)
        self.pause_button.setVisible(pause)
        self.resume_button.setVisible(resume)
        self.cancel_button.setVisible(cancel)

    def set_idle(self, text: str, downloadable: bool, size: int | None = None) -> None:
        self.headline.setText(text)
        self.headline.setVisible(bool(text))
        self.progress.hide()
        self.detail.hide()
        self.warning.hide()
        self.error.hide()
        self.download_button.setText(f"Download {format_bytes(size)}" if size else "Download")
        self._buttons(download=downloadable)
        self.setVisible(bool(text) or downloadable)

    def set_progress(self, p: ev.Progress) -> None:
        self.updates += 1
        self.setVisible(True)
        self.headline.setText(f"Downloading… {format_bytes(p.bytes_done)} of {format_bytes(p.bytes_total)} ({100 * p.fraction:.0f}%)")
        self.headline.show()
        self.progress.show()
        self.progress.setValue(int(1000 * p.fraction))
        parts = []
        if p.speed_bps > 0:
            parts.append(f"{format_bytes(p.speed_bps)}/s")
        eta = format_eta(p.eta_s)
        if eta:
            parts.append(eta)
        self.detail.setText(" · ".join(parts) or "Starting…")
        self.detail.show()
        if p.stalled:
            self.show_warning(f"No data for {p.stalled_s:.0f} s — the connection may have stalled; it will be retried.")
        elif self.warning.property("kind") == "stall":
            self.warning.hide()
        self.error.hide()
        self._buttons(pause=True, cancel=True)

    def show_warning(self, text: str, kind: str = "stall") -> None:
        self.warning.setText(text)
        self.warning.setProperty("kind", kind)
        self.warning.show()

    def set_paused(self, kept: int, total: int | None) -> None:
        of = f" of {format_bytes(total)}" if total else ""
        self.headline.setText(f"Paused — {format_bytes(kept)}{of} kept on disk")
        self.headline.show()
        self.detail.hide()
        self.warning.hide()
        self._buttons(resume=True, cancel=True)

    def set_failed(self, message: str, action: str) -> None:
        self.setVisible(True)
        self.headline.setText("Download failed")
        self.headline.show()
        self.detail.hide()
        self.warning.hide()
        self.error.setText(f"{message}\n{action}" if action else message)
        self.error.show()
        self._buttons(resume=True, cancel=True)
        self.resume_button.setText("Try Again")

    def set_done(self, text: str) -> None:
        self.set_idle(text, downloadable=False)


# What to do about each failure kind (DownloadError.kind); the message itself comes from the core.
ACTIONS: dict[DownloadErrorKind, str] = {
    DownloadErrorKind.NOT_FOUND: "Check the model name, or set HF_TOKEN if the repo is private.",
    DownloadErrorKind.REVISION_NOT_FOUND: "Choose another revision of the model.",
    DownloadErrorKind.UNAUTHORIZED: "Set HF_TOKEN (or run `hf auth login`) with a token that can read this repo.",
    DownloadErrorKind.GATED: "Accept the model's terms on huggingface.co, then set HF_TOKEN.",
    DownloadErrorKind.OFFLINE: "Connect to the internet (and unset HF_HUB_OFFLINE), then try again.",
    DownloadErrorKind.DISK_FULL: "Free some disk space, then press Try Again: what was fetched is kept.",
    DownloadErrorKind.NETWORK: "Check your connection, then press Try Again: the download resumes where it stopped.",
    DownloadErrorKind.SERVER: "The hub is having trouble; try again in a few minutes: the download resumes where it stopped.",
    DownloadErrorKind.INTEGRITY: "Press Try Again: the damaged file is fetched again.",
    DownloadErrorKind.BUSY: "Another Qwen Desk or qwen-desk command is downloading this model; wait for it to finish.",
}


@dataclass
class _WindowJob(DownloadJob):
    """A download job with the thread that runs it and the bridge that carries its events to the GUI thread."""

    bridge: EventBridge | None = None
    thread: threading.Thread | None = None


_STATUS = {JobState.RUNNING: "↓", JobState.PAUSED: "Paused", JobState.FAILED: "Failed"}


class DownloadController(QObject):
    """Runs core downloads on their own threads and shows the selected model's download in the panel."""

    finished = Signal(str)  # key (repo) of a completed download
    status_changed = Signal(str, str)  # repo, short text for the library's Status column ("" = none)
    hub_checked = Signal(bool)  # whether the hub answered the last check (at start, and with each download)
    _hub_answer = Signal(bool)  # from the checking thread

    def __init__(self, panel: DownloadPanel, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.panel = panel
        self.row: Row | None = None
        self.jobs: dict[str, _WindowJob] = {}  # by repo
        self.hub_unreachable = False  # the last check found no hub: said up front, before Download is pressed
        self._hub_answer.connect(self._hub_answered)
        panel.start_clicked.connect(self.start)
        panel.resume_clicked.connect(self.start)
        panel.pause_clicked.connect(self.pause)
        panel.cancel_clicked.connect(self.cancel)

    # -- queries (core) -----------------------------------------------------------------------------------------
    def local_path(self, ref: ModelRef) -> Path | None:
        local = inspect_repo(ref.repo) if ref.repo else None
        return local.path if local is not None and local.complete else None

    # -- panel --------------------------------------------------------------------------------------------------
    def show_for(self, row: Row | None) -> None:
        self.row = row
        if row is None or row.ref.repo is None:
            self.panel.set_idle("", downloadable=False)
            return
        job = self.jobs.get(row.ref.repo)
        if job is None:
            if row.local_path is not None:
                self.panel.set_done(f"Downloaded · {row.local_path}" if row.ref.origin is not Origin.LOCAL else "")
            elif _offline():
                self.panel.set_idle("Downloads are unavailable offline (HF_HUB_OFFLINE is set).", downloadable=False)
            elif self.hub_unreachable:
                self.panel.set_idle(
                    f"Downloads are unavailable: {hub_settings().host_label} cannot be reached (this Mac seems to be offline). Download tries again.",
                    downloadable=True,
                    size=row.estimate.weights_bytes,
                )
            else:
                self.panel.set_idle("Not on this Mac yet.", downloadable=True, size=row.estimate.weights_bytes)
            return
        self._render(job)

    def _render(self, job: DownloadJob) -> None:
        match job.state:
            case JobState.RUNNING if job.last is not None:
                self.panel.set_progress(job.last)
            case JobState.RUNNING:
                self.panel.set_idle("Preparing download…", downloadable=False)
                self.panel._buttons(cancel=True)
            case JobState.PAUSED:
                self.panel.set_paused(job.bytes_kept, job.last.bytes_total if job.last else None)
            case JobState.FAILED:
                self.panel.set_failed(str(job.error), ACTIONS.get(job.error.kind, "") if job.error is not None else "")
        if job.notice and job.state is JobState.RUNNING:
            self.panel.show_warning(job.notice, kind="notice")

    def status_text(self, repo: str) -> str:
        job = self.jobs.get(repo)
        if job is None:
            return ""
        pct = f" {100 * job.last.fraction:.0f}%" if job.last is not None and job.state is not JobState.FAILED else ""
        return _STATUS[job.state] + pct if job.state in _STATUS else ""

    def _is_shown(self, repo: str) -> bool:
        return self.row is not None and self.row.ref.repo == repo

    def check_hub(self, wait: bool = False) -> None:
        """Ask whether the hub can be reached (a quick TCP check off the GUI thread; not when HF_HUB_OFFLINE
        already says so): hub_checked tells the answer, and a panel waiting for a Download says it."""
        if _offline():
            return

        def ask() -> None:
            reachable = hub_reachable()
            try:
                self._hub_answer.emit(reachable)
            except RuntimeError:  # the window closed while the check ran
                pass

        probe = threading.Thread(target=ask, name="hub check", daemon=True)
        probe.start()
        if wait:
            probe.join()

    def _hub_answered(self, reachable: bool) -> None:
        changed = self.hub_unreachable == reachable
        self.hub_unreachable = not reachable
        if changed and (self.row is None or self._current_job() is None):
            self.show_for(self.row)
        self.hub_checked.emit(reachable)

    # -- actions ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self.row is None or self.row.ref.repo is None:
            return
        self.start_download(self.row.ref.repo)

    def start_download(self, repo: str) -> None:
        job = self.jobs.get(repo)
        if job and job.state is JobState.RUNNING:
            return
        bridge = EventBridge(parent=self)
        bridge.delivered.connect(lambda batch, r=repo: self._on_events(r, batch))
        job = _WindowJob(repo, bridge=bridge)
        token = job.token
        self.jobs[repo] = job

        def work() -> None:
            # A quick TCP check first: with the network down the client would retry for half a minute.
            reachable = hub_reachable()
            self._hub_answer.emit(reachable)
            if not reachable:
                bridge.feed(
                    ev.DownloadFailed(
                        error=DownloadError(
                            DownloadErrorKind.OFFLINE,
                            f"Cannot reach the hub to download {repo}: this Mac seems to be offline, or the hub is down.",
                            repo=repo,
                        )
                    )
                )
                return
            try:
                manager.download(repo, on_event=bridge.feed, cancel=token)
            except DownloadError:
                pass  # already reported as a DownloadFailed or DownloadStopped event
            except Exception as exc:  # anything unexpected still reaches the panel
                error = DownloadError(DownloadErrorKind.ERROR, f"{type(exc).__name__}: {exc}", repo=repo)
                bridge.feed(ev.DownloadFailed(error=error))

        bridge.start()
        job.thread = threading.Thread(target=work, name=f"download {repo}", daemon=True)
        job.thread.start()
        if self._is_shown(repo):
            self._render(job)

    def pause(self) -> None:
        job = self._current_job()
        if job and job.state is JobState.RUNNING:
            job.token.cancel()

    def cancel(self) -> None:
        """Stop the download, then ask whether to keep the part fetched (to resume later) or delete it."""
        job = self._current_job()
        if not job or self.row is None or not self.row.ref.repo:  # a current job is the row's: it has both
            return
        repo = self.row.ref.repo
        if job.state is JobState.RUNNING:
            # Stop like a pause; the question asked once it has stopped decides what happens to the data.
            job.cancel_after = True
            job.token.cancel()
            return
        self._ask_discard(repo)

    def _ask_discard(self, repo: str) -> None:
        local = inspect_repo(repo)
        kept = local.bytes_on_disk if local is not None else 0
        if kept:
            box = QMessageBox(
                QMessageBox.Icon.Question,
                "Cancel Download",
                f"{format_bytes(kept)} of {repo} is already on this Mac. Keep it to resume later, or delete it?",
                parent=self.panel,
            )
            box.setObjectName("DiscardDialog")
            keep = box.addButton("Keep", QMessageBox.ButtonRole.AcceptRole)
            delete = box.addButton("Delete", QMessageBox.ButtonRole.DestructiveRole)
            box.setDefaultButton(keep)
            box.exec()
            if box.clickedButton() is delete:
                try:
                    delete_model(repo)  # refuses while another process is downloading it
                except DownloadError as exc:
                    QMessageBox.warning(self.panel, "Cannot Delete", str(exc))
                    return
            else:
                job = self.jobs.get(repo)
                if job is not None:
                    job.state = JobState.PAUSED
                    if self._is_shown(repo):
                        self._render(job)
                    return
        self.jobs.pop(repo, None)
        self.status_changed.emit(repo, "")
        if self.row is not None:
            self.show_for(self.row)

    def _current_job(self) -> _WindowJob | None:
        return self.jobs.get(self.row.ref.repo) if self.row is not None and self.row.ref.repo else None

    def _on_events(self, repo: str, batch: list[ev.DownloadEvent]) -> None:
        job = self.jobs.get(repo)
        if job is None:
            return
        for e in batch:
            job.apply(e)
        self.status_changed.emit(repo, self.status_text(repo))
        if job.state is JobState.DONE:
            self.jobs.pop(repo, None)
            self.status_changed.emit(repo, "")
            self.finished.emit(repo)  # the library refreshes, which re-shows the panel
            return
        if self._is_shown(repo):
            self._render(job)
        if job.state is JobState.PAUSED and job.cancel_after:
            job.cancel_after = False
            self._ask_discard(repo)

    def shutdown(self) -> None:
        for job in self.jobs.values():
            if job.state is JobState.RUNNING:
                job.token.cancel()


def _offline() -> bool:
    return hub_offline()
