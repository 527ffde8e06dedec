"""Downloads that never lose data: planned, resumable, verified, cancellable, into the Hugging Face cache.

    plan = plan_download("mlx-community/Qwen3.5-0.8B-4bit")       # exact sizes, disk check, fit verdict
    token = CancelToken()
    result = download(plan, on_event=print, cancel=token)          # from a worker thread; token.cancel() to pause
    inspect_repo(repo), list_downloaded(), downloaded_repos(), delete_model(repo)

Events (`on_event`): Planned, Progress (with a FileProgress per file), Stalled, Retrying, Notice, and exactly one
of DownloadFinished / DownloadFailed / DownloadStopped at the end.
"""

from macapp.core.download.errors import DownloadCancelled, DownloadError, DownloadErrorKind
from macapp.core.download.events import (
    DownloadEvent,
    DownloadFailed,
    DownloadFinished,
    DownloadStopped,
    FileProgress,
    FileState,
    Notice,
    Planned,
    Progress,
    Retrying,
    Stalled,
)
from macapp.core.download.hfcache import NEEDED_PATTERNS, OnDisk, RemoteFile, hub_cache_dir
from macapp.core.download.local import (
    LocalModel,
    delete_model,
    downloaded_repos,
    inspect_repo,
    list_downloaded,
)
from macapp.core.download.manager import CancelToken, DownloadResult, DownloadSettings, download
from macapp.core.download.plan import DownloadPlan, plan_download

__all__ = [
    "DownloadCancelled",
    "DownloadError",
    "DownloadErrorKind",
    "DownloadEvent",
    "DownloadFailed",
    "DownloadFinished",
    "DownloadStopped",
    "FileProgress",
    "FileState",
    "Notice",
    "Planned",
    "Progress",
    "Retrying",
    "Stalled",
    "NEEDED_PATTERNS",
    "OnDisk",
    "RemoteFile",
    "hub_cache_dir",
    "LocalModel",
    "delete_model",
    "downloaded_repos",
    "inspect_repo",
    "list_downloaded",
    "CancelToken",
    "DownloadResult",
    "DownloadSettings",
    "download",
    "DownloadPlan",
    "plan_download",
]
