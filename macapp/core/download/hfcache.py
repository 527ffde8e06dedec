"""The standard Hugging Face cache layout (what huggingface_hub and mlx-lm read and write), plus our small additions.

    $HF_HOME/hub/models--org--name/
        blobs/<etag>                 file contents, named by sha256 (LFS files) or git blob id (small files)
        blobs/<etag>.incomplete      our resumable partial file (huggingface_hub's own are <etag>.<8 hex>.incomplete)
        snapshots/<commit>/<path>    relative symlinks into blobs/
        refs/main                    the commit the branch pointed at when the download finished
        trees/<commit>.json          huggingface_hub's cached file listing (lets it check completeness offline)
        .qwen-desk-verified.json     blobs whose hash we checked: etag -> [size, mtime_ns]
    $HF_HOME/hub/.locks/models--org--name/<etag>.lock   the per-blob lock huggingface_hub also takes

Everything is read from the environment at call time (HF_HUB_CACHE, HF_HOME), never at import.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shutil
import stat
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from macapp.core.hub.api import RemoteFile
from macapp.core.hub.settings import hub_cache_dir

# The files an MLX chat needs: the same patterns mlx_lm.load fetches (mlx_lm.utils.DEFAULT_ALLOW_PATTERNS), so a
# model we fetched is complete for mlx-lm and one mlx-lm fetched is complete for us. Copied, not imported: importing
# mlx_lm loads MLX.
NEEDED_PATTERNS = [
    "*.json",
    "model*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]
MARKS_FILE = ".qwen-desk-verified.json"
PARTIAL_SUFFIX = ".incomplete"
_HF_ORPHAN = re.compile(r"^(?P<etag>[0-9a-fA-F]+)\.(?P<tag>[0-9a-f]{8})\.incomplete$")
TREE_FORMAT_VERSION = 1
WEIGHT_INDEX = "model.safetensors.index.json"
SINGLE_WEIGHTS = "model.safetensors"


def needed_files(files: list[RemoteFile]) -> list[RemoteFile]:
    from huggingface_hub.utils import filter_repo_objects

    return list(filter_repo_objects(files, allow_patterns=NEEDED_PATTERNS, key=lambda f: f.path))


# --- where things are --------------------------------------------------------------------------------------------
def repo_folder_name(repo: str) -> str:
    return "--".join(["models", *repo.split("/")])


def repo_from_folder_name(name: str) -> str | None:
    if not name.startswith("models--"):
        return None
    return "/".join(name[len("models--") :].split("--"))


def repo_dir(repo: str, cache: Path | None = None) -> Path:
    return (cache or hub_cache_dir()) / repo_folder_name(repo)


def locks_dir(repo: str, cache: Path | None = None) -> Path:
    return (cache or hub_cache_dir()) / ".locks" / repo_folder_name(repo)


def blob_path(rdir: Path, etag: str) -> Path:
    return rdir / "blobs" / etag


def partial_path(rdir: Path, etag: str) -> Path:
    return rdir / "blobs" / (etag + PARTIAL_SUFFIX)


def snapshot_dir(rdir: Path, commit: str) -> Path:
    return rdir / "snapshots" / commit


def ensure_repo_dirs(rdir: Path) -> None:
    # snapshots/ must exist as soon as the folder does, or huggingface_hub's scan_cache_dir calls it corrupted.
    for sub in ("blobs", "snapshots", "refs"):
        (rdir / sub).mkdir(parents=True, exist_ok=True)


# --- refs and listings -------------------------------------------------------------------------------------------
def read_ref(rdir: Path, revision: str) -> str | None:
    if re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    try:
        return (rdir / "refs" / revision).read_text().strip() or None
    except OSError:
        return None


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_ref(rdir: Path, revision: str, commit: str) -> None:
    if revision != commit and read_ref(rdir, revision) != commit:
        _atomic_write(rdir / "refs" / revision, commit)


def write_listing(rdir: Path, commit: str, files: list[RemoteFile]) -> None:
    """Store the hub's listing in huggingface_hub's tree-cache format, so both tools can judge completeness offline."""
    entries = {}
    for f in sorted(files, key=lambda f: f.path):
        info: dict[str, object] = {"size": f.size, "blob_id": f.blob_id}
        if f.sha256:
            info.update(lfs_sha256=f.sha256, lfs_size=f.size)
        entries[f.path] = info
    _atomic_write(rdir / "trees" / f"{commit}.json", json.dumps({"format_version": TREE_FORMAT_VERSION, "files": entries}, indent=1))


def read_listing(rdir: Path, commit: str) -> list[RemoteFile] | None:
    try:
        data = json.loads((rdir / "trees" / f"{commit}.json").read_text())
        if data.get("format_version") != TREE_FORMAT_VERSION:
            return None
        return [RemoteFile(path=p, size=int(i["size"]), blob_id=i["blob_id"], sha256=i.get("lfs_sha256")) for p, i in data["files"].items()]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def listing_from_snapshot(rdir: Path, commit: str) -> list[RemoteFile] | None:
    """Rebuild a listing from a snapshot folder when none was stored (a model fetched by an older huggingface_hub).

    Blobs are named after their hash (sha256 for LFS files, the git blob id otherwise), so every file can still be
    checked offline. None when config.json or a weight file (the shards the index names, else model.safetensors)
    is missing.
    """
    snap = snapshot_dir(rdir, commit)
    if not snap.is_dir():
        return None
    files = []
    for entry in sorted(snap.rglob("*")):
        if not entry.is_file():
            continue
        rel = entry.relative_to(snap).as_posix()
        name = entry.resolve().name if entry.is_symlink() else ""
        if re.fullmatch(r"[0-9a-f]{64}", name):
            files.append(RemoteFile(rel, entry.stat().st_size, blob_id="", sha256=name))
        elif re.fullmatch(r"[0-9a-f]{40}", name):
            files.append(RemoteFile(rel, entry.stat().st_size, blob_id=name))
        else:
            return None  # a plain copy: nothing to check it against
    present = {f.path for f in files}
    if not weight_names(snap) <= present or "config.json" not in present:
        return None
    return files


def weight_names(snapshot: Path) -> set[str]:
    """The weight files a snapshot needs: the shards its model.safetensors.index.json names, else model.safetensors."""
    try:
        shards = set(json.loads((snapshot / WEIGHT_INDEX).read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        shards = set()
    return {s for s in shards if isinstance(s, str)} or {SINGLE_WEIGHTS}


def has_weights(files: Sequence[RemoteFile]) -> bool:
    return any(f.is_weight for f in files)


# --- verified marks ----------------------------------------------------------------------------------------------
def load_marks(rdir: Path) -> dict[str, list[int]]:
    try:
        data = json.loads((rdir / MARKS_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def add_mark(rdir: Path, etag: str, path: Path) -> None:
    marks = load_marks(rdir)
    marks[etag] = _stamp(path)
    _atomic_write(rdir / MARKS_FILE, json.dumps(marks, indent=1, sort_keys=True))


def is_marked(marks: dict[str, list[int]], etag: str, path: Path) -> bool:
    try:
        return marks.get(etag) == _stamp(path)
    except OSError:
        return False


# --- placing files -----------------------------------------------------------------------------------------------
def publish_blob(partial: Path, blob: Path) -> None:
    """Move a finished, verified partial file into place with the permissions huggingface_hub gives its blobs."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(partial, 0o666 & ~umask)
    os.replace(partial, blob)


def link_snapshot(rdir: Path, commit: str, relpath: str, etag: str) -> Path:
    """snapshots/<commit>/<relpath> -> ../../blobs/<etag> (a relative symlink; a copy where symlinks fail)."""
    dst = snapshot_dir(rdir, commit) / relpath
    dst.parent.mkdir(parents=True, exist_ok=True)
    src = blob_path(rdir, etag)
    if dst.is_symlink() or dst.exists():
        if dst.resolve() == src.resolve():
            return dst
        dst.unlink()
    try:
        os.symlink(os.path.relpath(src, dst.parent), dst)
    except OSError:
        shutil.copyfile(src, dst)
    return dst


# --- locks -------------------------------------------------------------------------------------------------------
@contextmanager
def try_lock(path: Path) -> Iterator[bool]:
    """Take an exclusive file lock without waiting; yields whether it was taken."""
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        yield False
        return
    except NotImplementedError:  # a filesystem without flock (some network mounts): go on unlocked
        yield True
        return
    try:
        yield True
    finally:
        lock.release()


def blob_lock_path(repo: str, etag: str, cache: Path | None = None) -> Path:
    return locks_dir(repo, cache) / f"{etag}.lock"


def repo_lock_path(repo: str, cache: Path | None = None) -> Path:
    return locks_dir(repo, cache) / "qwen-desk-download.lock"


# --- orphans -----------------------------------------------------------------------------------------------------
@dataclass
class OrphanReport:
    adopted_bytes: int = 0
    removed_bytes: int = 0
    removed_files: int = 0


def clean_orphans(repo: str, rdir: Path, wanted_etags: set[str], cache: Path | None = None) -> OrphanReport:
    """Deal with huggingface_hub temp files left by a killed process (`<etag>.<8 hex>.incomplete`).

    An orphan of a blob we still need is adopted as our partial file when it holds more bytes than ours (its
    content is a prefix of the blob; the final hash check guards against anything else); other orphans are
    removed. A temp file whose blob lock is held belongs to a live download and is left alone.
    """
    report = OrphanReport()
    blobs = rdir / "blobs"
    if not blobs.is_dir():
        return report
    for orphan in sorted(blobs.iterdir()):
        m = _HF_ORPHAN.match(orphan.name)
        if not m:
            continue
        etag = m["etag"]
        with try_lock(blob_lock_path(repo, etag, cache)) as free:
            if not free:
                continue
            try:
                size = orphan.stat().st_size
            except OSError:
                continue
            ours = partial_path(rdir, etag)
            ours_size = ours.stat().st_size if ours.exists() else 0
            if etag in wanted_etags and not blob_path(rdir, etag).exists() and size > ours_size:
                os.replace(orphan, ours)
                report.adopted_bytes += size
            else:
                orphan.unlink(missing_ok=True)
                report.removed_bytes += size
                report.removed_files += 1
    return report


# --- what is on disk ---------------------------------------------------------------------------------------------
class OnDisk(enum.StrEnum):
    """What the cache holds of one needed file."""

    READY = "ready"  # complete, and its hash was checked by us
    PRESENT = "present"  # complete (right size), hash not yet checked
    PARTIAL = "partial"  # resumable bytes
    MISSING = "missing"


@dataclass(frozen=True)
class LocalFile:
    remote: RemoteFile
    state: OnDisk
    bytes_on_disk: int
    location: Path | None  # the complete file (snapshot entry or blob), when there is one


def local_state(rdir: Path, commit: str, files: list[RemoteFile]) -> list[LocalFile]:
    marks = load_marks(rdir)
    out = []
    for f in files:
        candidates = [snapshot_dir(rdir, commit) / f.path, blob_path(rdir, f.etag)]
        found = None
        for c in candidates:
            try:
                if c.is_file() and c.stat().st_size == f.size:
                    found = c
                    break
            except OSError:
                continue
        if found is not None:
            state = OnDisk.READY if is_marked(marks, f.etag, found.resolve()) else OnDisk.PRESENT
            out.append(LocalFile(f, state, f.size, found))
            continue
        part = partial_path(rdir, f.etag)
        sizes = [part.stat().st_size] if part.exists() else []
        blobs = rdir / "blobs"
        if blobs.is_dir():
            sizes += [p.stat().st_size for p in blobs.glob(f"{f.etag}.*.incomplete") if _HF_ORPHAN.match(p.name)]
        have = min(max(sizes, default=0), f.size)
        out.append(LocalFile(f, OnDisk.PARTIAL if have else OnDisk.MISSING, have, None))
    return out


def is_complete(files: Sequence[LocalFile]) -> bool:
    """The one test of a downloaded model: it has weight files, and every needed file is on disk at its listed size
    (a cache folder holding only config.json is not a model)."""
    return has_weights([f.remote for f in files]) and all(f.state in (OnDisk.READY, OnDisk.PRESENT) for f in files)


def is_verified(files: Sequence[LocalFile]) -> bool:
    """Complete, and every file's hash was checked by us (what "ready" means)."""
    return is_complete(files) and all(f.state == OnDisk.READY for f in files)


def free_bytes(path: Path) -> int:
    """Free space on the volume that holds `path` (or its nearest existing parent)."""
    for p in [path, *path.parents]:
        try:
            return shutil.disk_usage(p).free
        except OSError:
            continue
    return 0


def _tmp_on_same_volume(rdir: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=rdir.parent, prefix=".qwen-desk-delete-"))


def remove_repo(repo: str, cache: Path | None = None) -> int:
    """Delete a repo's cache folder (all revisions, partial files) and its locks; returns bytes freed."""
    rdir = repo_dir(repo, cache)
    if not rdir.exists():
        return 0
    freed = 0
    for p in rdir.rglob("*"):
        try:
            st = p.lstat()
            if stat.S_ISREG(st.st_mode):
                freed += st.st_size
        except OSError:
            pass
    # Rename first so a half-finished delete never looks like a model.
    trash = _tmp_on_same_volume(rdir)
    os.replace(rdir, trash / rdir.name)
    shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(locks_dir(repo, cache), ignore_errors=True)
    return freed
