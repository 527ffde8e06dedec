"""Downloads that never lose data: planned, resumable, verified, cancellable, into the Hugging Face cache.

    plan = plan_download("mlx-community/Qwen3.5-0.8B-4bit")       # exact sizes, disk check, fit verdict
    token = CancelToken()
    result = download(plan, on_event=print, cancel=token)          # from a worker thread; token.cancel() to pause
    is_ready(repo), list_downloaded(), downloaded_repos(), delete_model(repo)
"""

from macapp.core.download.errors import KINDS, DownloadCancelled, DownloadError
from macapp.core.download.events import (
    Cancelled,
    DownloadEvent,
    Failed,
    FileProgress,
    Finished,
    Notice,
    Planned,
    Progress,
    Retrying,
    Stalled,
)
from macapp.core.download.hfcache import NEEDED_PATTERNS, RemoteFile, hub_cache_dir
from macapp.core.download.local import (
    LocalModel,
    delete_model,
    downloaded_repos,
    inspect_repo,
    is_ready,
    list_downloaded,
)
from macapp.core.download.manager import CancelToken, DownloadResult, DownloadSettings, download
from macapp.core.download.plan import DownloadPlan, plan_download

__all__ = [
    "KINDS", "DownloadCancelled", "DownloadError",
    "Cancelled", "DownloadEvent", "Failed", "FileProgress", "Finished", "Notice", "Planned", "Progress", "Retrying",
    "Stalled",
    "NEEDED_PATTERNS", "RemoteFile", "hub_cache_dir",
    "LocalModel", "delete_model", "downloaded_repos", "inspect_repo", "is_ready", "list_downloaded",
    "CancelToken", "DownloadResult", "DownloadSettings", "download",
    "DownloadPlan", "plan_download",
]
