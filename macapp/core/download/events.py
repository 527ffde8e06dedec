"""What a download reports while it runs: small frozen records handed to the caller's `on_event` callback."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

from macapp.core.events import TerminalEvent

if TYPE_CHECKING:
    from macapp.core.hub.errors import DownloadError
    from macapp.core.download.plan import DownloadPlan


class FileState(enum.StrEnum):
    """Where one file of a running download is, in the order a file normally goes through them."""

    PENDING = "pending"  # not started (may hold partial bytes from an earlier run)
    CHECKING = "checking"  # hashing bytes already on disk (a resumed partial file, or a file another tool fetched)
    DOWNLOADING = "downloading"
    RETRYING = "retrying"  # waiting out a backoff after a transient error
    VERIFYING = "verifying"
    READY = "ready"  # complete and verified against the hub's hash
    FAILED = "failed"


@dataclass(frozen=True)
class FileProgress:
    path: str
    size: int
    done: int  # bytes on disk for this file
    state: FileState


@dataclass(frozen=True)
class Planned:
    plan: "DownloadPlan"


@dataclass(frozen=True)
class Progress:
    """A snapshot, sent a few times a second and on every file state change."""

    bytes_done: int  # on disk, all needed files (includes what earlier runs fetched)
    bytes_total: int
    bytes_this_run: int  # received over the network by this run
    speed_bps: float  # averaged over the last few seconds; 0 while stalled
    eta_s: float | None  # None while the speed is unknown or zero
    stalled_s: float  # seconds without a byte, once past the stall threshold; else 0
    files: tuple[FileProgress, ...]

    @property
    def stalled(self) -> bool:
        return self.stalled_s > 0

    @property
    def fraction(self) -> float:
        return self.bytes_done / self.bytes_total if self.bytes_total else 1.0


@dataclass(frozen=True)
class Stalled:
    """No byte arrived for `seconds`: reported once per stall (the transfer is retried if it lasts)."""

    seconds: float


@dataclass(frozen=True)
class Retrying:
    path: str
    attempt: int  # the attempt about to start (2 = first retry)
    max_attempts: int
    delay_s: float
    reason: str


@dataclass(frozen=True)
class Notice:
    """Something a person should know that is not an error (a hash mismatch being re-fetched, adopted partial data)."""

    message: str


# A download ends with exactly one of these three (named apart from the engine's Finished/Failed).
@dataclass(frozen=True)
class DownloadResult:
    repo: str
    revision: str
    commit: str
    path: Path  # the snapshot folder: what mlx_lm.load(path) takes
    bytes_total: int
    bytes_downloaded_this_run: int
    files: tuple[str, ...]
    verified: bool
    elapsed_s: float
    resumed_bytes: int = 0  # bytes found on disk (earlier runs, other tools) and not fetched again
    refetched: tuple[str, ...] = ()  # files whose hash check failed and that were fetched again

    def to_json(self) -> dict[str, object]:
        return {
            "repo": self.repo,
            "revision": self.revision,
            "commit": self.commit,
            "path": str(self.path),
            "bytes_total": self.bytes_total,
            "bytes_downloaded_this_run": self.bytes_downloaded_this_run,
            "files": list(self.files),
            "verified": self.verified,
            "elapsed_s": round(self.elapsed_s, 3),
            "resumed_bytes": self.resumed_bytes,
            "refetched": list(self.refetched),
        }


@dataclass(frozen=True)
class DownloadFinished(TerminalEvent):
    """Every needed file is present and hash-checked."""

    result: DownloadResult


@dataclass(frozen=True)
class DownloadFailed(TerminalEvent):
    """It cannot go on; `error.kind` says why, `str(error)` what to do. What was fetched is kept."""

    error: "DownloadError"


@dataclass(frozen=True)
class DownloadStopped(TerminalEvent):
    """Cancelled (a pause, Ctrl-C): `bytes_kept` stay on disk and the next download of it resumes from them."""

    bytes_kept: int


DownloadEvent = Union[Planned, Progress, Stalled, Retrying, Notice, DownloadFinished, DownloadFailed, DownloadStopped]
