"""Which models are on this machine already: an offline look at the Hugging Face cache (no network, no MLX).

Built on the download module's cache helpers, so "downloaded" means exactly what a download leaves behind:
every needed file of the stored listing present at its full size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from macapp.core.download import hfcache


@dataclass(frozen=True)
class LocalModel:
    repo: str
    path: Path | None  # the snapshot folder when complete (what the engine loads), else None
    bytes_on_disk: int  # complete and partial files together
    bytes_total: int  # of the needed files; 0 when nothing is known locally


def local_model(repo: str, revision: str = "main") -> LocalModel:
    rdir = hfcache.repo_dir(repo)
    commit = hfcache.read_ref(rdir, revision) if rdir.is_dir() else None
    partial = commit is None
    if partial and rdir.is_dir():
        # A download under way or paused writes its listing first and the ref only at the end.
        trees = sorted((rdir / "trees").glob("*.json"), key=lambda p: p.stat().st_mtime)
        commit = trees[-1].stem if trees else None
    listing = hfcache.read_listing(rdir, commit) if commit else None
    if not listing:
        return LocalModel(repo, None, 0, 0)
    needed = hfcache.needed_files(listing)
    files = hfcache.local_state(rdir, commit, needed)
    complete = not partial and bool(files) and all(f.state in ("ready", "present") for f in files)
    return LocalModel(
        repo=repo,
        path=hfcache.snapshot_dir(rdir, commit) if complete else None,
        bytes_on_disk=sum(f.bytes_on_disk for f in files),
        bytes_total=sum(f.remote.size for f in files),
    )


def local_model_path(repo: str, revision: str = "main") -> Path | None:
    """The snapshot folder of a completely downloaded repo, else None."""
    return local_model(repo, revision).path
