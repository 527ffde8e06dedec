"""One download as a front end follows it: where it is, its last progress, and what to tell the person."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from macapp.core.hub.errors import DownloadError
from macapp.core.download.events import (
    DownloadEvent,
    DownloadFailed,
    DownloadFinished,
    DownloadStopped,
    Notice,
    Progress,
    Retrying,
)
from macapp.core.download.manager import CancelToken


class JobState(enum.Enum):
    RUNNING = "running"
    PAUSED = "paused"  # stopped with its data kept on disk: the next download resumes from it
    FAILED = "failed"
    DONE = "done"


@dataclass
class DownloadJob:
    """Fed the events of one `download()` run (`apply`), in order, on one thread."""

    repo: str
    token: CancelToken = field(default_factory=CancelToken)
    state: JobState = JobState.RUNNING
    last: Progress | None = None  # the latest progress snapshot
    error: DownloadError | None = None  # why it failed
    notice: str = ""  # the latest notice or retry, for a person
    kept: int | None = None  # bytes kept on disk when it stopped
    cancel_after: bool = False  # a cancel came while it ran: ask about the kept data once it has stopped

    def apply(self, event: DownloadEvent) -> None:
        match event:
            case Progress():
                self.last = event
            case Notice(message=message):
                self.notice = message
            case Retrying():
                self.notice = f"Retrying {Path(event.path).name} (attempt {event.attempt} of {event.max_attempts}): {event.reason}"
            case DownloadFinished():
                self.state = JobState.DONE
            case DownloadFailed(error=error):
                self.state, self.error = JobState.FAILED, error
            case DownloadStopped(bytes_kept=kept):
                self.state, self.kept = JobState.PAUSED, kept

    @property
    def bytes_kept(self) -> int:
        """What a stopped download left on disk (the last progress figure when it did not say)."""
        if self.kept is not None:
            return self.kept
        return self.last.bytes_done if self.last is not None else 0
