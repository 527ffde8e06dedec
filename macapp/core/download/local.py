"""What is already downloaded: readiness, a listing with sizes, deletion. Reads the cache only, never the network."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from macapp.core.download import hfcache
from macapp.core.hub.errors import DownloadError, DownloadErrorKind
from macapp.core.hub.api import RemoteFile
from macapp.core.hub.settings import hub_cache_dir


@dataclass(frozen=True)
class LocalModel:
    repo: str
    commit: str | None
    path: Path | None  # the snapshot folder (what mlx_lm.load takes), when there is one
    bytes_on_disk: int  # everything under the repo's cache folder, partial files included
    bytes_total: int | None  # the needed files' total, when the listing is known
    complete: bool  # every needed file present at its listed size
    verified: bool  # ... and every one hash-checked by us (what "ready" means)
    partial_bytes: int  # bytes in resumable partial files

    @property
    def ready(self) -> bool:
        return self.complete and self.verified


def _folder_bytes(rdir: Path) -> tuple[int, int]:
    total = partial = 0
    blobs = rdir / "blobs"
    for p in rdir.rglob("*"):
        try:
            if p.is_symlink() or not p.is_file():
                continue
            size = p.stat().st_size
        except OSError:
            continue
        total += size
        if p.parent == blobs and p.name.endswith(hfcache.PARTIAL_SUFFIX):
            partial += size
    return total, partial


def _files_from_index(snapshot: Path) -> list[RemoteFile] | None:
    """Without a stored listing or hash-named blobs (plain copies): config.json and the weights the index names."""
    files = []
    for name in ["config.json", *sorted(hfcache.weight_names(snapshot))]:
        p = snapshot / name
        if not p.is_file():
            return None
        files.append(RemoteFile(path=name, size=p.stat().st_size, blob_id=""))
    return files


def inspect_repo(repo: str, revision: str = "main", cache: Path | None = None) -> LocalModel | None:
    """The state of one repo in the cache (None when nothing of it is there)."""
    rdir = hfcache.repo_dir(repo, cache)
    if not rdir.is_dir():
        return None
    on_disk, partial = _folder_bytes(rdir)
    commit = hfcache.read_ref(rdir, revision)
    if commit is None:
        # No ref yet (a download in progress writes it at the end): the newest snapshot or stored listing.
        seen = [*(rdir / "snapshots").glob("*"), *(rdir / "trees").glob("*.json")]
        seen.sort(key=lambda p: p.stat().st_mtime)
        commit = seen[-1].name.removesuffix(".json") if seen else None
    if commit is None:
        return LocalModel(repo, None, None, on_disk, None, False, False, partial)
    snapshot = hfcache.snapshot_dir(rdir, commit)
    listing = hfcache.read_listing(rdir, commit) or hfcache.listing_from_snapshot(rdir, commit)
    if listing is None:
        files = _files_from_index(snapshot) if snapshot.is_dir() else None
        return LocalModel(repo, commit, snapshot if snapshot.is_dir() else None, on_disk, None, files is not None, False, partial)
    needed = hfcache.needed_files(listing)
    states = hfcache.local_state(rdir, commit, needed)
    complete = hfcache.is_complete(states)
    verified = hfcache.is_verified(states)
    return LocalModel(repo, commit, snapshot if snapshot.is_dir() else None, on_disk, sum(f.size for f in needed), complete, verified, partial)


def list_downloaded(include_partial: bool = True) -> list[LocalModel]:
    """Every model repo in the Hugging Face cache (ours or fetched by other tools), with sizes on disk."""
    cache = hub_cache_dir()
    if not cache.is_dir():
        return []
    out = []
    for folder in sorted(cache.iterdir()):
        repo = hfcache.repo_from_folder_name(folder.name)
        if repo is None or not folder.is_dir():
            continue
        model = inspect_repo(repo, cache=cache)
        if model is not None and (include_partial or model.complete):
            out.append(model)
    return out


def downloaded_repos() -> dict[str, LocalModel]:
    """repo id -> LocalModel for every complete model in the cache (for `qwen-desk models` and the model picker).

    Complete is not ready: a model fetched by another tool (`hf download`, snapshot_download) is usable but its
    hashes were not checked here until `download()` runs on it (`LocalModel.verified` tells which)."""
    return {m.repo: m for m in list_downloaded(include_partial=False)}


def delete_model(repo: str) -> int:
    """Remove a repo from the cache (all its revisions and partial files); returns the bytes freed."""
    with hfcache.try_lock(hfcache.repo_lock_path(repo)) as free:
        if not free:
            raise DownloadError(DownloadErrorKind.BUSY, f"{repo} is being downloaded right now; cancel that first", repo=repo)
    return hfcache.remove_repo(repo)
