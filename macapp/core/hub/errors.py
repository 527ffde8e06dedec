"""Failures of reading from the hub or downloading from it (listings, range reads, downloads, the MTP head's
fetch): one exception type with a `kind` the UI can branch on and a message a person can act on."""

from __future__ import annotations

import enum
import errno


class DownloadErrorKind(enum.StrEnum):
    """Why a download cannot go on (the `kind` in `qwen-desk download --json` and what the window's advice is keyed on)."""

    NOT_FOUND = "not_found"  # the repo does not exist (or is private and no token was given)
    REVISION_NOT_FOUND = "revision_not_found"  # the repo exists but not that branch, tag or commit
    UNAUTHORIZED = "unauthorized"  # the hub refused the token, or the repo needs one
    GATED = "gated"  # the repo is gated: accept its terms on the hub and give a token
    OFFLINE = "offline"  # HF_HUB_OFFLINE is set, or the hub cannot be reached, and the model is not complete locally
    DISK_FULL = "disk_full"  # not enough free space, before or during the download
    NETWORK = "network"  # the connection failed and retries were exhausted
    SERVER = "server"  # the hub answered with server errors and retries were exhausted
    INTEGRITY = "integrity"  # a file's size or hash disagrees with the hub's listing
    BUSY = "busy"  # another process is downloading the same model
    CANCELLED = "cancelled"  # the download was cancelled (what was fetched is kept)
    ERROR = "error"  # anything unexpected (a bug): the message says what


TOKEN_HINT = "set HF_TOKEN or run `hf auth login`"
RESUME_HINT = "run the same download again to resume; what was fetched is kept"
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class DownloadError(Exception):
    """A download that cannot go on: `kind` says why, `str(error)` is the actionable message."""

    def __init__(self, kind: DownloadErrorKind, message: str, *, repo: str | None = None, path: str | None = None, bytes_kept: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.repo = repo
        self.path = path
        self.bytes_kept = bytes_kept

    def __str__(self) -> str:
        return self.message


class DownloadCancelled(DownloadError):
    """Raised by `download` when its cancel token fires; the partial data stays on disk for a resume."""

    def __init__(self, message: str = "download cancelled", *, repo: str | None = None, bytes_kept: int = 0) -> None:
        super().__init__(DownloadErrorKind.CANCELLED, message, repo=repo, bytes_kept=bytes_kept)


class ConnectionDropped(Exception):
    """The body ended before the expected bytes arrived (a transient error: resume from where it stopped)."""


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_ERRNOS
