"""Download failures: one exception type with a `kind` the UI can branch on and a message a person can act on."""

from __future__ import annotations

import errno

# kind -> what it means
KINDS = {
    "not_found": "the repo does not exist (or is private and no token was given)",
    "revision_not_found": "the repo exists but not that branch, tag or commit",
    "unauthorized": "the hub refused the token, or the repo needs one",
    "gated": "the repo is gated: accept its terms on the hub and give a token",
    "offline": "HF_HUB_OFFLINE is set, or the hub cannot be reached, and the model is not complete locally",
    "disk_full": "not enough free space, before or during the download",
    "network": "the connection failed and retries were exhausted",
    "server": "the hub answered with server errors and retries were exhausted",
    "integrity": "a file's size or hash disagrees with the hub's listing",
    "busy": "another process is downloading the same model",
    "cancelled": "the download was cancelled (what was fetched is kept)",
}

TOKEN_HINT = "set HF_TOKEN or run `hf auth login`"
RESUME_HINT = "run the same download again to resume; what was fetched is kept"
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class DownloadError(Exception):
    """A download that cannot go on. `kind` is one of KINDS; `str(error)` is the actionable message."""

    def __init__(self, kind: str, message: str, *, repo: str | None = None, path: str | None = None,
                 bytes_kept: int = 0) -> None:
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
        super().__init__("cancelled", message, repo=repo, bytes_kept=bytes_kept)


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_ERRNOS

