"""Downloads that never lose data: planned, resumable, verified, cancellable, into the Hugging Face cache.

    plan = plan_download("mlx-community/Qwen3.5-0.8B-4bit")       # exact sizes, disk check, fit verdict
    token = CancelToken()
    result = download(plan, on_event=print, cancel=token)          # from a worker thread; token.cancel() to pause
    inspect_repo(repo), list_downloaded(), downloaded_repos(), delete_model(repo)

Events (`on_event`): Planned, Progress (with a FileProgress per file), Stalled, Retrying, Notice, and exactly one
of DownloadFinished / DownloadFailed / DownloadStopped at the end.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `X as X`: the names this package hands on
    from macapp.core.download.events import DownloadEvent as DownloadEvent
    from macapp.core.download.events import DownloadFailed as DownloadFailed
    from macapp.core.download.events import DownloadFinished as DownloadFinished
    from macapp.core.download.events import DownloadResult as DownloadResult
    from macapp.core.download.events import DownloadStopped as DownloadStopped
    from macapp.core.download.events import FileProgress as FileProgress
    from macapp.core.download.events import FileState as FileState
    from macapp.core.download.events import Notice as Notice
    from macapp.core.download.events import Planned as Planned
    from macapp.core.download.events import Progress as Progress
    from macapp.core.download.events import Retrying as Retrying
    from macapp.core.download.events import Stalled as Stalled
    from macapp.core.download.hfcache import NEEDED_PATTERNS as NEEDED_PATTERNS
    from macapp.core.download.hfcache import OnDisk as OnDisk
    from macapp.core.download.local import LocalModel as LocalModel
    from macapp.core.download.local import delete_model as delete_model
    from macapp.core.download.local import downloaded_repos as downloaded_repos
    from macapp.core.download.local import inspect_repo as inspect_repo
    from macapp.core.download.local import list_downloaded as list_downloaded
    from macapp.core.download.manager import CancelToken as CancelToken
    from macapp.core.download.manager import DownloadSettings as DownloadSettings
    from macapp.core.download.manager import download as download
    from macapp.core.download.plan import DownloadPlan as DownloadPlan
    from macapp.core.download.plan import plan_download as plan_download
    from macapp.core.hub.api import RemoteFile as RemoteFile
    from macapp.core.hub.errors import DownloadCancelled as DownloadCancelled
    from macapp.core.hub.errors import DownloadError as DownloadError
    from macapp.core.hub.errors import DownloadErrorKind as DownloadErrorKind
    from macapp.core.hub.settings import hub_cache_dir as hub_cache_dir

# Each name's module, imported on first use: `import macapp.core.download.hfcache` (the catalog, the fit) does not
# load the downloader; the imports above are the same names for the type checker (a test checks they agree).
_HOMES = {
    **dict.fromkeys(
        (
            "DownloadEvent",
            "DownloadFailed",
            "DownloadFinished",
            "DownloadResult",
            "DownloadStopped",
            "FileProgress",
            "FileState",
            "Notice",
            "Planned",
            "Progress",
            "Retrying",
            "Stalled",
        ),
        "macapp.core.download.events",
    ),
    **dict.fromkeys(("NEEDED_PATTERNS", "OnDisk"), "macapp.core.download.hfcache"),
    **dict.fromkeys(("LocalModel", "delete_model", "downloaded_repos", "inspect_repo", "list_downloaded"), "macapp.core.download.local"),
    **dict.fromkeys(("CancelToken", "DownloadSettings", "download"), "macapp.core.download.manager"),
    **dict.fromkeys(("DownloadPlan", "plan_download"), "macapp.core.download.plan"),
    **dict.fromkeys(("RemoteFile",), "macapp.core.hub.api"),
    **dict.fromkeys(("DownloadCancelled", "DownloadError", "DownloadErrorKind"), "macapp.core.hub.errors"),
    **dict.fromkeys(("hub_cache_dir",), "macapp.core.hub.settings"),
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
