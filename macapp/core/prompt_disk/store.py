"""The prompt checkpoints on disk: `<app home>/cache/prompts/<fingerprint>/<digest>.safetensors`, bounded, shared.

    store = DiskStore.open()                      # the app's folder, the default size (sizes.py)
    found = store.lookup(fp, tokens, classes)     # worker: the longest stored proper prefix of `tokens`, or None
    store.put(fp, "model name", checkpoint)       # worker: copied for the writer thread, written off the decode path
    store.flush()                                 # wait for the writes queued so far

One folder per fingerprint (fingerprint.py): other weights or settings find nothing of this model's. A file holds
one checkpoint, its KV from its parent's length on (entry.py), so a conversation's checkpoints share their KV on
disk as in memory. The store is shared by every process of the app (the server, the window, `qwen-desk chat`):
files are written whole (a temporary file, fsync, rename), and an index finds those another process wrote when
the folder changed. Least recently used files go first beyond `max_bytes` (a file read or continued is used),
with the files that continue them. Writing stops, with a log line, when the disk's free space would fall under
`floor_bytes`. A file that cannot be read back as it was written is logged, removed and skipped: the prompt is
read afresh.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from macapp.core import paths
from macapp.core.modelfiles import read_safetensors_header
from macapp.core.prompt_disk.keys import prefix_digests
from macapp.core.prompt_disk.entry import BadEntry, Encoded, EntryInfo, Part, crcs, decode, encode, info_of, read_part
from macapp.core.prompt_disk.sizes import FLOOR_BYTES, default_bytes

if TYPE_CHECKING:
    from macapp.core.engine.positions import SavedPosition

log = logging.getLogger("macapp.prompt_disk")
SUFFIX = ".safetensors"


def prompts_dir() -> Path:
    """Where the checkpoints live: the app's cache folder (QWEN_DESK_HOME moves it)."""
    return paths.cache_dir() / "prompts"


@dataclass
class _Index:
    """One fingerprint's files as this process knows them."""

    folder: Path
    entries: dict[str, EntryInfo] = field(default_factory=dict)  # digest -> entry, written files only
    pending: dict[str, EntryInfo] = field(default_factory=dict)  # queued for the writer
    seen: set[str] = field(default_factory=set)  # file names whose headers were read
    stamp: int = -1  # the folder's mtime when last scanned

    def lengths(self) -> set[int]:
        return {e.length for e in (*self.entries.values(), *self.pending.values())}


@dataclass(frozen=True)
class _Write:
    folder: Path
    info: EntryInfo
    encoded: Encoded


@dataclass(frozen=True)
class FolderSummary:
    """One model's checkpoints on disk (for `qwen-desk cache`)."""

    fingerprint: str
    model: str
    files: int
    nbytes: int


class DiskStore:
    """Checkpoints on disk under `root` (see the module docstring). lookup and put on the engine's worker."""

    def __init__(self, root: Path, max_bytes: int, floor_bytes: int = FLOOR_BYTES):
        self.root = Path(root)
        self.max_bytes = max(0, int(max_bytes))
        self.floor_bytes = floor_bytes
        self.writing = self.max_bytes > 0
        self._lock = threading.Lock()
        self._indexes: dict[str, _Index] = {}
        self._lru: collections.OrderedDict[Path, int] = collections.OrderedDict()  # every file under root, oldest first
        self.nbytes = 0
        self.written = self.read = self.dropped = 0  # files written, checkpoints read back, bad files removed
        self._queue: queue.Queue[_Write | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        if self.max_bytes:
            self.root.mkdir(parents=True, exist_ok=True)
            self._scan_all()

    @classmethod
    def open(cls, max_bytes: int | None = None, root: Path | None = None) -> "DiskStore":
        """The app's store (`max_bytes` None: the default size, sizes.default_bytes)."""
        root = root if root is not None else prompts_dir()
        return cls(root, default_bytes(root) if max_bytes is None else max_bytes)

    # -- reading (worker) -------------------------------------------------------------------------------
    def lookup(self, fingerprint: str, tokens: Sequence[int | str], expected: Sequence[type], longer_than: int = 0) -> SavedPosition | None:
        """The longest stored checkpoint of a proper prefix of `tokens` longer than `longer_than` tokens, read back
        (`expected`: the layer classes of a fresh cache of the model), or None."""
        if not self.max_bytes:
            return None
        index = self._index(fingerprint)
        with self._lock:
            lengths = sorted((n for n in index.lengths() if longer_than < n < len(tokens)), reverse=True)
        digests = prefix_digests(tokens, lengths)
        with self._lock:
            queued = any(digests[n] in index.pending for n in lengths)
        if queued:  # a position of this prompt is still on its way to disk: wait for it rather than read its tokens again
            self.flush()
        for n in lengths:
            with self._lock:
                entry = index.entries.get(digests[n])
            if entry is None:
                continue
            found = self._read(index, entry, tokens, expected)
            if found is not None:
                return found
        return None

    def _read(self, index: _Index, entry: EntryInfo, tokens: Sequence[int | str], expected: Sequence[type]) -> SavedPosition | None:
        chain = [entry]
        with self._lock:
            while chain[0].parent:
                parent = index.entries.get(chain[0].parent)
                if parent is None:
                    break
                chain.insert(0, parent)
        path = index.folder / f"{entry.digest}{SUFFIX}"
        try:
            if chain[0].parent:
                raise BadEntry("the file it continues is gone")
            want = prefix_digests(tokens, [e.length for e in chain])
            parts: list[Part] = []
            for e in chain:
                path = index.folder / f"{e.digest}{SUFFIX}"
                part = read_part(str(path))
                if part.metadata.get("digest") != want[e.length] or e.digest != want[e.length]:
                    raise BadEntry("another prompt than its name says")
                parts.append(part)
            checkpoint = decode(parts, tokens[: entry.length], expected)
        except FileNotFoundError:  # removed by another process: not this one's to log
            self._forget(index, path, removed=True)
            return None
        except BadEntry as exc:
            log.warning("prompt cache: %s is unusable (%s): removed, the prompt is read afresh", path, exc)
            self._forget(index, path, removed=False)
            with self._lock:
                self.dropped += 1
            return None
        self._touch([index.folder / f"{e.digest}{SUFFIX}" for e in chain])
        with self._lock:
            self.read += 1
        return checkpoint

    # -- writing ----------------------------------------------------------------------------------------
    def put(self, fingerprint: str, model: str, checkpoint: SavedPosition) -> bool:
        """Queue `checkpoint` for writing (worker: its new KV is copied here); False when it is not written
        (writing off, there already, a checkpoint of several Macs, a layer this store cannot hold)."""
        if not self.writing or checkpoint.mirror is not None:
            return False
        index = self._index(fingerprint)
        tokens = checkpoint.tokens
        with self._lock:
            lengths = {n for n in index.lengths() if n < len(tokens)} | {len(tokens)}
        digests = prefix_digests(tokens, lengths)
        digest = digests[len(tokens)]
        with self._lock:
            known = index.entries.get(digest) or index.pending.get(digest)
            parent = None
            for n in sorted(lengths - {len(tokens)}, reverse=True):  # the longest stored prefix: this file continues it
                parent = index.entries.get(digests[n]) or index.pending.get(digests[n])
                if parent is not None:
                    break
        if known is not None:
            if digest in index.entries:
                self._touch([index.folder / f"{digest}{SUFFIX}"])
            return False
        try:
            encoded = encode(checkpoint, digest, parent, fingerprint, model)
        except BadEntry as exc:
            log.info("prompt cache: a checkpoint not written to disk: %s", exc)
            return False
        info = EntryInfo(digest, len(tokens), parent.digest if parent else "", parent.length if parent else 0, encoded.nbytes)
        with self._lock:
            index.pending[digest] = info
        self._start_writer()
        self._queue.put(_Write(index.folder, info, encoded))
        return True

    def flush(self) -> None:
        """Wait until the writes queued so far are on disk (or given up)."""
        self._queue.join()

    def close(self) -> None:
        """Finish the queued writes and stop the writer thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _start_writer(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, name="prompt-cache-writer", daemon=True)
                self._thread.start()

    def _writer(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._write(job)
            except Exception:
                log.exception("prompt cache: a checkpoint could not be written to disk")
                if job is not None:
                    self._abandon(job)
            finally:
                self._queue.task_done()

    def _abandon(self, job: _Write) -> None:
        with self._lock:
            for index in self._indexes.values():
                if index.folder == job.folder:
                    index.pending.pop(job.info.digest, None)

    def _write(self, job: _Write) -> None:
        import mlx.core as mx

        size = job.encoded.nbytes
        if not self.writing or size > self.max_bytes:
            self._abandon(job)
            return
        free = shutil.disk_usage(self.root).free
        if free - size < self.floor_bytes:
            self.writing = False
            log.warning(
                "prompt cache: writing to disk turned off: %.1f GB free on the disk of %s, under the floor of %.1f GB kept free "
                "(checkpoints already there are still read; it turns on again at the next start)",
                free / 1e9,
                self.root,
                self.floor_bytes / 1e9,
            )
            self._abandon(job)
            return
        job.folder.mkdir(parents=True, exist_ok=True)
        final = job.folder / f"{job.info.digest}{SUFFIX}"
        temp = job.folder / f".{job.info.digest}.{os.getpid()}.tmp{SUFFIX}"
        metadata = {**job.encoded.metadata, "crc": json.dumps(crcs(job.encoded.arrays))}
        mx.save_safetensors(str(temp), job.encoded.arrays, metadata=metadata)
        with open(temp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temp, final)
        _sync_dir(job.folder)
        nbytes = final.stat().st_size
        info = EntryInfo(job.info.digest, job.info.length, job.info.parent, job.info.parent_length, nbytes)
        with self._lock:
            for index in self._indexes.values():
                if index.folder == job.folder:
                    index.pending.pop(info.digest, None)
                    index.entries[info.digest] = info
                    index.seen.add(final.name)
            self.nbytes += nbytes - self._lru.get(final, 0)  # the index may have found it already (_index)
            self._lru[final] = nbytes
            self._lru.move_to_end(final)
            self.written += 1
        if job.info.parent:  # the chain it continues is in use: it goes after this file, never before
            self._touch(self._chain_paths(job.folder, job.info.parent))
            self._touch([final])
        self._evict()

    # -- the bound ----------------------------------------------------------------------------------------
    def _evict(self) -> None:
        while True:
            with self._lock:
                if self.nbytes <= self.max_bytes or not self._lru:
                    return
                oldest = next(iter(self._lru))
            self._remove(oldest)

    def _remove(self, path: Path) -> None:
        """Remove `path` and the files that continue it (useless without it)."""
        doomed = [path]
        with self._lock:
            for index in self._indexes.values():
                if index.folder == path.parent:
                    digest = path.name[: -len(SUFFIX)]
                    family, grew = {digest}, True
                    while grew:
                        more = {d for d, e in index.entries.items() if e.parent in family} - family
                        family |= more
                        grew = bool(more)
                    doomed += [index.folder / f"{d}{SUFFIX}" for d in family - {digest}]
                    for d in family:
                        index.entries.pop(d, None)
            for p in doomed:
                self.nbytes -= self._lru.pop(p, 0)
        for p in doomed:
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def _forget(self, index: _Index, path: Path, removed: bool) -> None:
        if removed:
            with self._lock:
                index.entries.pop(path.name[: -len(SUFFIX)], None)
                self.nbytes -= self._lru.pop(path, 0)
        else:
            self._remove(path)

    def _touch(self, files: Sequence[Path]) -> None:
        for path in files:
            try:
                os.utime(path)
            except OSError:
                continue
            with self._lock:
                if path in self._lru:
                    self._lru.move_to_end(path)

    def _chain_paths(self, folder: Path, digest: str) -> list[Path]:
        with self._lock:
            index = next((i for i in self._indexes.values() if i.folder == folder), None)
            out: list[Path] = []
            while index is not None and digest:
                out.insert(0, folder / f"{digest}{SUFFIX}")
                entry = index.entries.get(digest)
                digest = entry.parent if entry is not None else ""
            return out

    # -- the index --------------------------------------------------------------------------------------
    def _scan_all(self) -> None:
        """Every file under root, by last use; temporary files left by a process that ended are removed."""
        found = []
        for path in self.root.glob(f"*/*{SUFFIX}"):
            if path.name.startswith("."):
                _remove_stale_temp(path)
                continue
            try:
                st = path.stat()
            except OSError:
                continue
            found.append((st.st_mtime_ns, path, st.st_size))
        with self._lock:
            for _, path, size in sorted(found):
                self._lru[path] = size
            self.nbytes = sum(self._lru.values())

    def _index(self, fingerprint: str) -> _Index:
        """The fingerprint's index, with the files written since the folder was last scanned."""
        with self._lock:
            index = self._indexes.get(fingerprint)
            if index is None:
                index = self._indexes[fingerprint] = _Index(self.root / fingerprint[:32])
        try:
            stamp = index.folder.stat().st_mtime_ns
        except FileNotFoundError:
            return index
        if stamp == index.stamp:
            return index
        names = {p.name for p in index.folder.glob(f"*{SUFFIX}") if not p.name.startswith(".")}
        with self._lock:
            new = names - index.seen
        for name in new:
            path = index.folder / name
            try:
                header = read_safetensors_header(path)
                info = info_of(header.metadata, path.stat().st_size, fingerprint)
                if f"{info.digest}{SUFFIX}" != name:
                    raise BadEntry("named for another prompt")
            except FileNotFoundError:
                continue
            except Exception as exc:  # a header that is not one of ours: garbled, truncated, another version
                log.warning("prompt cache: %s is unusable (%s): removed", path, exc)
                path.unlink(missing_ok=True)
                with self._lock:
                    self.nbytes -= self._lru.pop(path, 0)
                    self.dropped += 1
                continue
            with self._lock:
                index.entries[info.digest] = info
                index.seen.add(name)
                if path not in self._lru:
                    self._lru[path] = info.nbytes
                    self.nbytes += info.nbytes
        with self._lock:
            index.stamp = stamp
        return index

    # -- what is kept (any process) --------------------------------------------------------------------
    def summary(self) -> list[FolderSummary]:
        """Each model's checkpoints on disk, the largest first."""
        out = []
        for folder in sorted(p for p in self.root.glob("*") if p.is_dir()) if self.root.is_dir() else []:
            files = [p for p in folder.glob(f"*{SUFFIX}") if not p.name.startswith(".")]
            model = ""
            for p in files:
                try:
                    model = str(read_safetensors_header(p).metadata.get("model", ""))
                    break
                except Exception:
                    continue
            out.append(FolderSummary(folder.name, model, len(files), sum(_size(p) for p in files)))
        return sorted(out, key=lambda s: s.nbytes, reverse=True)

    def clear(self) -> int:
        """Remove every checkpoint file (every model's); the bytes freed."""
        freed = 0
        for path in self.root.glob(f"*/*{SUFFIX}") if self.root.is_dir() else []:
            freed += _size(path)
            path.unlink(missing_ok=True)
        with self._lock:
            self._lru.clear()
            self.nbytes = 0
            for index in self._indexes.values():
                index.entries.clear()
                index.seen.clear()
                index.stamp = -1
        return freed


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _sync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_temp(path: Path) -> None:
    """A temporary file (.DIGEST.PID.tmp.safetensors) whose writer is no longer running: a write cut short."""
    try:
        pid = int(path.name.split(".")[2])
    except (IndexError, ValueError):
        return
    if pid == os.getpid():
        return
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        path.unlink(missing_ok=True)
    except OSError:
        pass
