"""Before anything is fetched: exactly what will be downloaded, what is already here, whether it fits the disk,
and (when the sizing model is there) whether the model fits this Mac."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from macapp.core import hardware
from macapp.core.download import hfcache
from macapp.core.hub import api
from macapp.core.hub.errors import DownloadCancelled, DownloadError, DownloadErrorKind
from macapp.core.download.hfcache import LocalFile
from macapp.core.fit import estimate
from macapp.core.hub.api import RemoteFile
from macapp.core.hub.settings import hub_cache_dir
from macapp.core.memory import format_bytes

if TYPE_CHECKING:
    from macapp.core.catalog import ModelRef

DEFAULT_DISK_MARGIN = 512 * 1024**2  # kept free on top of what the download needs (plus 1% of it)


@dataclass(frozen=True)
class DownloadPlan:
    repo: str
    revision: str
    commit: str
    files: tuple[LocalFile, ...]  # the needed files only, with what is on disk for each
    cache_dir: Path
    disk_free: int
    disk_margin: int
    from_cache_only: bool = False  # the hub was not asked (offline) or could not be reached
    fit: estimate.Estimate | None = None  # when the sizing model could run
    fit_note: str = ""  # why there is no fit verdict
    all_files: tuple[RemoteFile, ...] = field(default=(), repr=False)  # the whole listing (stored for huggingface_hub)
    made_at: float = field(default_factory=time.time, compare=False)

    @property
    def bytes_total(self) -> int:
        return sum(f.remote.size for f in self.files)

    @property
    def bytes_on_disk(self) -> int:
        return sum(f.bytes_on_disk for f in self.files)

    @property
    def bytes_to_fetch(self) -> int:
        return self.bytes_total - self.bytes_on_disk

    @property
    def weights_bytes(self) -> int:
        return sum(f.remote.size for f in self.files if f.remote.is_weight)

    @property
    def disk_needed(self) -> int:
        return self.bytes_to_fetch + self.disk_margin if self.bytes_to_fetch else 0

    @property
    def disk_ok(self) -> bool:
        return self.disk_free >= self.disk_needed

    @property
    def ready(self) -> bool:
        """Every needed file is present and its hash was checked."""
        return hfcache.is_verified(self.files)

    @property
    def complete(self) -> bool:
        """Every needed file is present at the right size (hash checks may remain)."""
        return hfcache.is_complete(self.files)

    @property
    def repo_dir(self) -> Path:
        return hfcache.repo_dir(self.repo, self.cache_dir)

    @property
    def snapshot_path(self) -> Path:
        return hfcache.snapshot_dir(self.repo_dir, self.commit)

    def disk_message(self) -> str:
        return (
            f"not enough disk space for {self.repo}: {format_bytes(self.bytes_to_fetch)} to fetch plus "
            f"{format_bytes(self.disk_margin)} kept free, but only {format_bytes(self.disk_free)} is free on the "
            f"volume of {self.cache_dir}; free some space (or point HF_HOME at a bigger disk) and run it again"
        )


def disk_margin_for(to_fetch: int, minimum: int = DEFAULT_DISK_MARGIN) -> int:
    return minimum + to_fetch // 100


def _fit(model: ModelRef | None, weights_bytes: int, context: int | None) -> tuple[estimate.Estimate | None, str]:
    """The sizing model's verdict for this build on this machine, or a note saying why there is none."""
    if model is None:
        return None, "no catalog entry or config for this model"
    try:
        if weights_bytes and hasattr(model, "weights_bytes"):
            model = dataclasses.replace(model, weights_bytes=weights_bytes)
        ctx = context or estimate.DEFAULT_CONTEXT  # the same default as `qwen-desk fit` and the window
        return estimate.estimate(model, ctx, hardware.detect_machine()), ""
    except Exception as exc:  # a verdict is advice: never let it stop a download
        return None, f"sizing failed: {type(exc).__name__}: {exc}"


def plan_download(
    repo: str,
    revision: str = "main",
    *,
    model: ModelRef | None = None,
    context: int | None = None,
    token: str | None = None,
    disk_margin: int | None = None,
    timeout: float = 15.0,
    attempts: int = 1,
    backoff_s: float = 1.0,
    on_retry: Callable[[int, int, float, str], None] | None = None,
    wait: Callable[[float], bool] | None = None,
) -> DownloadPlan:
    """Ask the hub for the file listing (or, offline, read the one stored in the cache) and compare with the disk.

    `model` is a macapp.core.catalog.ModelRef for the fit verdict (optional). Transient hub errors are retried
    `attempts` times (`wait(seconds)` sleeps and returns True when cancelled). Raises DownloadError for a repo or
    revision that does not exist, missing access, or offline with nothing stored.
    """
    cache = hub_cache_dir()
    rdir = hfcache.repo_dir(repo, cache)
    tok = token if token is not None else api.token()
    listing: list[RemoteFile] | None = None
    commit: str | None = None
    from_cache_only = False
    if api.is_offline():
        from_cache_only = True
    else:
        for attempt in range(1, max(1, attempts) + 1):
            try:
                result = api.fetch_listing(repo, revision, tok, timeout=timeout)
                commit, listing = result.commit, result.files
                break
            except Exception as exc:
                transient, error = api.classify(exc, repo, revision, has_token=bool(tok))
                if not transient:
                    raise error from None
                unreachable = error
                if attempt < attempts:
                    delay = min(backoff_s * 2 ** (attempt - 1), 30.0)
                    if on_retry is not None:
                        on_retry(attempt + 1, attempts, delay, str(error))
                    if wait is not None and wait(delay):
                        raise DownloadCancelled(f"download of {repo} cancelled", repo=repo) from None
        else:
            # The hub cannot be reached right now: a model that is complete here is still usable.
            from_cache_only = True
            if attempts > 1:
                unreachable = DownloadError(unreachable.kind, f"{unreachable} (gave up after {attempts} attempts)", repo=repo)
    if from_cache_only:
        commit = hfcache.read_ref(rdir, revision)
        listing = hfcache.read_listing(rdir, commit) if commit else None
        if listing is None and commit:
            listing = hfcache.listing_from_snapshot(rdir, commit)
        if listing is None:
            if api.is_offline():
                raise DownloadError(
                    DownloadErrorKind.OFFLINE,
                    f"{repo} is not in the local cache and HF_HUB_OFFLINE is set: unset it (or set HF_HUB_OFFLINE=0) to download it",
                    repo=repo,
                )
            raise DownloadError(unreachable.kind, f"{unreachable}; {repo} is not in the local cache", repo=repo)
    if listing is None or commit is None:  # every path above found both, or raised
        raise RuntimeError(f"{repo}: neither the hub nor the cache gave a file listing at a commit")
    needed = hfcache.needed_files(listing)
    if not hfcache.has_weights(needed):
        raise DownloadError(DownloadErrorKind.NOT_FOUND, f"{repo} has no MLX weight files (model*.safetensors): is it an MLX build?", repo=repo)
    files = tuple(hfcache.local_state(rdir, commit, needed))
    to_fetch = sum(f.remote.size - f.bytes_on_disk for f in files)
    margin = disk_margin if disk_margin is not None else disk_margin_for(to_fetch)
    weights = sum(f.size for f in needed if f.is_weight)
    fit, note = _fit(model, weights, context)
    return DownloadPlan(
        repo=repo,
        revision=revision,
        commit=commit,
        files=files,
        cache_dir=cache,
        disk_free=hfcache.free_bytes(rdir),
        disk_margin=margin,
        from_cache_only=from_cache_only,
        fit=fit,
        fit_note=note,
        all_files=tuple(listing),
    )
