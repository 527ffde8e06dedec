"""Running a download: a few worker threads move bytes, the calling thread reports progress and watches the cancel
token. Call `download()` from a worker thread in a UI; events arrive on that thread through `on_event`."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from macapp.core.download import events as ev
from macapp.core.download.events import DownloadResult, FileState
from macapp.core.download import hfcache
from macapp.core.hub import api
from macapp.core.hub.errors import RESUME_HINT, DownloadCancelled, DownloadError, DownloadErrorKind
from macapp.core.download.hfcache import LocalFile, OnDisk
from macapp.core.hub.api import RemoteFile
from macapp.core.memory import format_bytes
from macapp.core.download.integrity import file_matches
from macapp.core.download.plan import DownloadPlan, plan_download
from macapp.core.download.transfer import PartialFile, fetch_into
from macapp.core.hub.errors import ConnectionDropped

if TYPE_CHECKING:  # httpx2 is imported when a download runs
    import httpx2

    from macapp.core.catalog import ModelRef

_MARKS_LOCK = threading.Lock()


class CancelToken:
    """Hand one to `download()`; `cancel()` from any thread stops it within about a second, keeping what is on disk
    (so pause = cancel, resume = download again). A worker whose request is still waiting for the server's first
    answer cannot be woken; it is left to end on its own and writes nothing once it sees the cancel."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True as soon as the token is cancelled."""
        return self._event.wait(seconds)


@dataclass(frozen=True)
class DownloadSettings:
    max_workers: int = 4  # files fetched at once
    attempts: int = 6  # per file: consecutive failed attempts (without a byte of progress) before giving up
    backoff_s: float = 1.0  # first retry delay, doubled each time
    backoff_max_s: float = 30.0
    stall_report_s: float = 5.0  # no byte for this long: reported as a stall
    cancel_grace_s: float = 1.0  # how long a stop waits for workers before returning
    stall_timeout_s: float = 30.0  # no byte for this long: the connection is dropped and the transfer resumed
    connect_timeout_s: float = 15.0
    progress_interval_s: float = 0.25
    speed_window_s: float = 5.0
    disk_margin: int | None = None  # bytes kept free on top of the download; None = 512 MiB + 1%


# --- progress bookkeeping (shared by the workers and the reporting thread) -----------------------------------------
@dataclass
class _FileTrack:
    size: int
    done: int
    state: FileState


@dataclass
class _Tracker:
    files: dict[str, _FileTrack]
    window_s: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    bytes_this_run: int = 0
    last_byte_at: float = field(default_factory=time.monotonic)
    samples: deque[tuple[float, int]] = field(default_factory=deque)  # (when, bytes this run then)
    sockets: dict[str, socket.socket] = field(default_factory=dict)
    changed: bool = True
    refetched: list[str] = field(default_factory=list)

    def add(self, path: str, n: int) -> None:
        with self.lock:
            self.files[path].done += n
            self.bytes_this_run += n
            self.last_byte_at = time.monotonic()

    def set(self, path: str, state: FileState, done: int | None = None) -> None:
        with self.lock:
            track = self.files[path]
            track.state = state
            if done is not None:
                track.done = done
            if state == FileState.DOWNLOADING:
                self.last_byte_at = time.monotonic()  # a stall is counted from when the transfer (re)starts
            self.changed = True

    def set_socket(self, path: str, sock: socket.socket | None) -> None:
        with self.lock:
            if sock is None:
                self.sockets.pop(path, None)
            else:
                self.sockets[path] = sock

    def drop_connections(self) -> None:
        """Wake every blocked read at once (closing alone does not interrupt a recv on another thread)."""
        with self.lock:
            socks = list(self.sockets.values())
        for sock in socks:
            try:
                # The plain-socket shutdown, also for TLS sockets: it wakes the reader without touching SSL state
                # that the reading thread is using.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def snapshot(self, stall_report_s: float) -> ev.Progress:
        now = time.monotonic()
        with self.lock:
            self.samples.append((now, self.bytes_this_run))
            while len(self.samples) > 2 and now - self.samples[0][0] > self.window_s:
                self.samples.popleft()
            downloading = any(t.state == FileState.DOWNLOADING for t in self.files.values())
            idle = now - self.last_byte_at
            stalled = idle if downloading and idle >= stall_report_s else 0.0
            t0, b0 = self.samples[0]
            speed = (self.bytes_this_run - b0) / (now - t0) if now - t0 >= 0.2 else 0.0
            if stalled:
                speed = 0.0  # a dead transfer shows zero, not the last figure
            done = sum(t.done for t in self.files.values())
            total = sum(t.size for t in self.files.values())
            files = tuple(ev.FileProgress(p, t.size, t.done, t.state) for p, t in self.files.items())
            self.changed = False
            this_run = self.bytes_this_run
        eta = (total - done) / speed if speed > 0 else None
        return ev.Progress(done, total, this_run, speed, eta, stalled, files)


Emit = Callable[[ev.DownloadEvent], None]


# --- the download -------------------------------------------------------------------------------------------------
def download(
    target: str | DownloadPlan,
    *,
    revision: str = "main",
    model: ModelRef | None = None,
    context: int | None = None,
    on_event: Callable[[ev.DownloadEvent], None] | None = None,
    cancel: CancelToken | None = None,
    settings: DownloadSettings | None = None,
    token: str | None = None,
) -> DownloadResult:
    """Fetch (or finish, or just check) a model into the Hugging Face cache; returns once every needed file is
    present and its hash checked. Raises DownloadCancelled when `cancel` fires and DownloadError (with `kind`)
    when it cannot finish; what was fetched stays on disk either way, so calling it again resumes."""
    settings = settings or DownloadSettings()
    cancel = cancel or CancelToken()
    emit = on_event or (lambda event: None)
    started = time.monotonic()
    repo = target.repo if isinstance(target, DownloadPlan) else target
    try:
        return _download(target, revision, model, context, emit, cancel, settings, token, started)
    except KeyboardInterrupt:
        cancel.cancel()
        raise DownloadCancelled(f"download of {repo} interrupted; {RESUME_HINT}", repo=repo) from None
    except DownloadCancelled as exc:
        emit(ev.DownloadStopped(exc.bytes_kept))
        raise
    except DownloadError as exc:
        emit(ev.DownloadFailed(exc))
        raise


def _download(
    target: str | DownloadPlan,
    revision: str,
    model: ModelRef | None,
    context: int | None,
    emit: Emit,
    cancel: CancelToken,
    settings: DownloadSettings,
    token: str | None,
    started: float,
) -> DownloadResult:
    tok = token if token is not None else api.token()
    if isinstance(target, DownloadPlan):
        plan = target
    else:
        plan = plan_download(
            target,
            revision,
            model=model,
            context=context,
            token=tok,
            disk_margin=settings.disk_margin,
            attempts=settings.attempts,
            backoff_s=settings.backoff_s,
            on_retry=lambda attempt, total, delay, reason: emit(ev.Retrying("(file listing)", attempt, total, delay, reason)),
            wait=cancel.wait,
        )
    repo = plan.repo
    emit(ev.Planned(plan))
    if cancel.cancelled:
        raise DownloadCancelled(repo=repo, bytes_kept=plan.bytes_on_disk)
    if plan.from_cache_only and not plan.complete:
        kind = DownloadErrorKind.OFFLINE if api.is_offline() else DownloadErrorKind.NETWORK
        why = "HF_HUB_OFFLINE is set" if kind is DownloadErrorKind.OFFLINE else f"{api.endpoint()} cannot be reached"
        raise DownloadError(
            kind,
            f"{repo} is not fully downloaded ({format_bytes(plan.bytes_on_disk)} of {format_bytes(plan.bytes_total)}) and {why}; {RESUME_HINT} once online",
            repo=repo,
            bytes_kept=plan.bytes_on_disk,
        )

    cache = plan.cache_dir
    rdir = plan.repo_dir
    with hfcache.try_lock(hfcache.repo_lock_path(repo, cache)) as mine:
        if not mine:
            raise DownloadError(DownloadErrorKind.BUSY, f"{repo} is being downloaded by another process; wait for it to finish", repo=repo)
        hfcache.ensure_repo_dirs(rdir)
        if not plan.from_cache_only and plan.all_files and hfcache.read_listing(rdir, plan.commit) is None:
            hfcache.write_listing(rdir, plan.commit, list(plan.all_files))
        remotes = [f.remote for f in plan.files]
        report = hfcache.clean_orphans(repo, rdir, {r.etag for r in remotes}, cache)
        if report.adopted_bytes:
            emit(ev.Notice(f"picked up {report.adopted_bytes} bytes left by an interrupted huggingface_hub download"))
        if report.removed_files:
            emit(ev.Notice(f"removed {report.removed_files} orphaned temporary file(s) ({report.removed_bytes} bytes)"))
        files = hfcache.local_state(rdir, plan.commit, remotes)  # the disk may have changed since the plan
        to_fetch = sum(f.remote.size - f.bytes_on_disk for f in files if f.state in (OnDisk.PARTIAL, OnDisk.MISSING))
        margin = settings.disk_margin if settings.disk_margin is not None else plan.disk_margin
        free = hfcache.free_bytes(rdir)
        if to_fetch and free < to_fetch + margin:
            raise DownloadError(
                DownloadErrorKind.DISK_FULL,
                f"not enough disk space for {repo}: {format_bytes(to_fetch)} to fetch "
                f"plus {format_bytes(margin)} kept free, but {format_bytes(free)} is free on the volume of "
                f"{cache}; free some space (or point HF_HOME at a bigger disk) and run it again",
                repo=repo,
                bytes_kept=sum(f.bytes_on_disk for f in files),
            )
        resumed = sum(f.bytes_on_disk for f in files)
        result = _run_files(repo, plan, files, emit, cancel, settings, tok)
        if plan.revision != plan.commit and not plan.from_cache_only:
            hfcache.write_ref(rdir, plan.revision, plan.commit)
    this_run, refetched = result
    final = DownloadResult(
        repo=repo,
        revision=plan.revision,
        commit=plan.commit,
        path=plan.snapshot_path,
        bytes_total=plan.bytes_total,
        bytes_downloaded_this_run=this_run,
        files=tuple(sorted(f.remote.path for f in files)),
        verified=True,
        elapsed_s=time.monotonic() - started,
        resumed_bytes=min(resumed, plan.bytes_total),
        refetched=tuple(refetched),
    )
    emit(ev.DownloadFinished(final))
    return final


def _run_files(
    repo: str, plan: DownloadPlan, files: list[LocalFile], emit: Emit, cancel: CancelToken, settings: DownloadSettings, tok: str | None
) -> tuple[int, list[str]]:
    """Run the per-file work on a pool; returns (bytes received this run, files re-fetched after a bad hash).

    A file whose bytes keep failing their check fails alone: the other files are fetched to the end (kept whole for
    the next try), then its error is raised. Any other error stops them all at once (what they have is kept)."""
    import httpx2

    rdir = plan.repo_dir
    tracker = _Tracker(
        {f.remote.path: _FileTrack(f.remote.size, f.bytes_on_disk, FileState.READY if f.state == OnDisk.READY else FileState.PENDING) for f in files},
        window_s=settings.speed_window_s,
    )
    stop = threading.Event()
    messages: queue.Queue[ev.DownloadEvent] = queue.Queue()
    headers = api.auth_headers(tok)
    base = api.endpoint()
    client = httpx2.Client(
        follow_redirects=True,
        timeout=httpx2.Timeout(settings.connect_timeout_s, read=settings.stall_timeout_s),
        limits=httpx2.Limits(max_connections=settings.max_workers + 2, max_keepalive_connections=settings.max_workers),
    )
    ctx = _Worker(repo, plan, rdir, tracker, stop, messages, client, headers, base, settings, tok)
    work = [f for f in files if f.state != OnDisk.READY]
    for f in files:
        if f.state == OnDisk.READY:
            hfcache.link_snapshot(rdir, plan.commit, f.remote.path, f.remote.etag)
    emit(tracker.snapshot(settings.stall_report_s))
    pool = ThreadPoolExecutor(max_workers=max(1, settings.max_workers), thread_name_prefix="qwen-desk-download")
    futures: set[Future[None]] = {pool.submit(ctx.run_file, f) for f in work}
    error: BaseException | None = None
    failed_alone: BaseException | None = None  # the first file that failed its check, raised once the rest are done
    last_emit = 0.0
    stall_reported = False
    interrupted = False
    try:
        while futures:
            done, futures = wait(futures, timeout=min(0.1, settings.progress_interval_s), return_when=FIRST_COMPLETED)
            for fut in done:
                exc = fut.exception()
                if isinstance(exc, DownloadError) and exc.kind is DownloadErrorKind.INTEGRITY:
                    failed_alone = failed_alone or exc
                elif exc is not None and error is None:
                    error = exc
                    stop.set()
                    tracker.drop_connections()
            if cancel.cancelled and not stop.is_set():
                stop.set()
                tracker.drop_connections()
            while not messages.empty():
                emit(messages.get_nowait())
            now = time.monotonic()
            if now - last_emit >= settings.progress_interval_s or tracker.changed:
                progress = tracker.snapshot(settings.stall_report_s)
                if progress.stalled and not stall_reported:
                    emit(ev.Stalled(progress.stalled_s))
                stall_reported = progress.stalled
                emit(progress)
                last_emit = now
            if stop.is_set():
                break  # the workers are joined below
    except KeyboardInterrupt:
        # Ctrl-C in a terminal: the same clean stop as a cancel, with what is kept on disk.
        cancel.cancel()
        interrupted = True
    finally:
        # Workers see `stop` between chunks and their sockets are shut down, so they end at once. One still waiting
        # for its response headers has no socket to shut down: it is not waited for (a cancel must take about a
        # second), and it checks `stop` before writing anything, so the cache is safe after the lock is released.
        stop.set()
        stragglers = _join(futures, tracker, grace_s=settings.cancel_grace_s)
        pool.shutdown(wait=not stragglers, cancel_futures=True)
        while not messages.empty():
            emit(messages.get_nowait())
        client.close()
    if interrupted:
        kept = tracker.snapshot(settings.stall_report_s).bytes_done
        raise DownloadCancelled(f"download of {repo} interrupted at {format_bytes(kept)}; {RESUME_HINT}", repo=repo, bytes_kept=kept)
    final = tracker.snapshot(settings.stall_report_s)
    emit(final)
    error = error or failed_alone
    if error is not None:
        if isinstance(error, DownloadError):
            if error.kind == DownloadErrorKind.DISK_FULL:
                error = DownloadError(
                    DownloadErrorKind.DISK_FULL,
                    f"{error.message or 'the disk filled up'} while downloading "
                    f"{repo} ({error.path}): {format_bytes(final.bytes_done)} are kept; free some "
                    "space and run it again to resume",
                    repo=repo,
                    path=error.path,
                    bytes_kept=final.bytes_done,
                )
            error.repo = error.repo or repo
            error.bytes_kept = final.bytes_done
            raise error
        raise DownloadError(
            DownloadErrorKind.SERVER, f"download of {repo} failed: {type(error).__name__}: {error}; {RESUME_HINT}", repo=repo, bytes_kept=final.bytes_done
        ) from error
    if any(t.state != FileState.READY for t in final.files):  # a cancel that came after the last file changes nothing
        raise DownloadCancelled(
            f"download of {repo} stopped at {final.bytes_done} of {final.bytes_total} bytes; {RESUME_HINT}", repo=repo, bytes_kept=final.bytes_done
        )
    return final.bytes_this_run, list(tracker.refetched)


def _join(futures: set[Future[None]], tracker: _Tracker, grace_s: float) -> set[Future[None]]:
    """Wait up to `grace_s` for the workers (the repeated socket shutdown also wakes one whose response arrived after
    the stop); returns those still waiting for a server's first answer."""
    pending = set(futures)
    deadline = time.monotonic() + grace_s
    while pending and time.monotonic() < deadline:
        tracker.drop_connections()
        _, pending = wait(pending, timeout=0.25)
    return pending


@dataclass
class _Worker:
    repo: str
    plan: DownloadPlan
    rdir: Path
    tracker: _Tracker
    stop: threading.Event
    messages: queue.Queue[ev.DownloadEvent]
    client: httpx2.Client
    headers: dict[str, str]
    base: str
    settings: DownloadSettings
    tok: str | None

    def run_file(self, lf: LocalFile) -> None:
        remote = lf.remote
        lock_path = hfcache.blob_lock_path(self.repo, remote.etag, self.plan.cache_dir)
        while not self.stop.is_set():
            with hfcache.try_lock(lock_path) as mine:
                if mine:
                    self._file_locked(lf)
                    return
            self.tracker.set(remote.path, FileState.PENDING)
            self.stop.wait(0.5)  # huggingface_hub (another process) is fetching this blob: wait for it

    def _file_locked(self, lf: LocalFile) -> None:
        remote = lf.remote
        blob = hfcache.blob_path(self.rdir, remote.etag)
        # A complete file is already here (fetched by another tool, or by us before a crash): check it, keep it.
        existing = lf.location if lf.location is not None else (blob if blob.is_file() else None)
        if existing is not None and existing.exists() and existing.stat().st_size == remote.size:
            self.tracker.set(remote.path, FileState.CHECKING)
            ok = file_matches(existing.resolve(), remote, cancelled=self.stop.is_set)
            if ok is None:
                return
            if ok:
                self._publish_existing(remote, existing)
                return
            self.messages.put(ev.Notice(f"{remote.path} on disk does not match the hub's hash; fetching it again"))
            self.tracker.refetched.append(remote.path)
            self.tracker.set(remote.path, FileState.PENDING, done=0)
        if self.plan.from_cache_only:
            offline = api.is_offline()
            self.tracker.set(remote.path, FileState.FAILED)
            raise DownloadError(
                DownloadErrorKind.OFFLINE if offline else DownloadErrorKind.NETWORK,
                f"{remote.path} of {self.repo} needs fetching again (missing or damaged) but "
                + ("HF_HUB_OFFLINE is set" if offline else f"{self.base} cannot be reached")
                + f"; {RESUME_HINT} once online",
                repo=self.repo,
                path=remote.path,
            )
        part_path = hfcache.partial_path(self.rdir, remote.etag)
        self.tracker.set(remote.path, FileState.CHECKING)
        part = PartialFile.open(remote, part_path, cancelled=self.stop.is_set)
        if self.stop.is_set():
            return
        self.tracker.set(remote.path, FileState.DOWNLOADING, done=part.done)
        url = api.resolve_url(self.repo, self.plan.commit, remote.path, self.base)
        failures = 0
        mismatches = 0
        while True:
            before = part.done
            try:
                fetch_into(
                    self.client,
                    url,
                    self.headers,
                    part,
                    cancelled=self.stop.is_set,
                    on_bytes=lambda n: self.tracker.add(remote.path, n),
                    on_socket=lambda s: self.tracker.set_socket(remote.path, s),
                    on_restart=lambda: self.tracker.set(remote.path, FileState.DOWNLOADING, done=0),
                )
            except Exception as exc:
                if self.stop.is_set():
                    return  # cancelled (our own socket shutdown surfaces as a read error)
                transient, error = _transient(exc, self.repo, self.plan.revision, bool(self.tok))
                if not transient:
                    raise error from exc
                failures = 1 if part.done > before else failures + 1
                if failures >= self.settings.attempts:
                    self.tracker.set(remote.path, FileState.FAILED)
                    raise DownloadError(
                        error.kind, f"gave up on {remote.path} after {failures} failed attempts: {error}; {RESUME_HINT}", repo=self.repo, path=remote.path
                    ) from exc
                delay = min(self.settings.backoff_s * 2 ** (failures - 1), self.settings.backoff_max_s)
                self.tracker.set(remote.path, FileState.RETRYING)
                self.messages.put(ev.Retrying(remote.path, failures + 1, self.settings.attempts, delay, str(error)))
                if self.stop.wait(delay):
                    return
                self.tracker.set(remote.path, FileState.DOWNLOADING)
                continue
            if self.stop.is_set() or not part.complete:
                return
            self.tracker.set(remote.path, FileState.VERIFYING)
            if part.digest_ok():
                break
            mismatches += 1
            if mismatches >= 2:
                part.path.unlink(missing_ok=True)  # corrupt twice: keep nothing that cannot be trusted
                self.tracker.set(remote.path, FileState.FAILED, done=0)
                raise DownloadError(
                    DownloadErrorKind.INTEGRITY,
                    f"{remote.path} failed its sha256 check twice (the server keeps sending different bytes than the hub lists); nothing corrupt was kept",
                    repo=self.repo,
                    path=remote.path,
                )
            self.messages.put(ev.Notice(f"{remote.path} failed its hash check; fetching that file again"))
            self.tracker.refetched.append(remote.path)
            part.restart()
            self.tracker.set(remote.path, FileState.DOWNLOADING, done=0)
        hfcache.publish_blob(part.path, blob)
        self._publish_existing(remote, blob)

    def _publish_existing(self, remote: RemoteFile, location: Path) -> None:
        blob = hfcache.blob_path(self.rdir, remote.etag)
        if location.resolve() != blob.resolve() and not blob.exists():
            # A verified copy outside blobs/ (a copied snapshot): link to where it really is.
            target = location.resolve()
        else:
            target = blob
        if target == blob:
            hfcache.link_snapshot(self.rdir, self.plan.commit, remote.path, remote.etag)
        try:
            with _MARKS_LOCK:
                hfcache.add_mark(self.rdir, remote.etag, target)
        except OSError:
            pass  # a read-only shared cache: the file was checked, it will just be checked again next time
        self.tracker.set(remote.path, FileState.READY, done=remote.size)


def _transient(exc: BaseException, repo: str, revision: str, has_token: bool) -> tuple[bool, DownloadError]:
    if isinstance(exc, ConnectionDropped):
        return True, DownloadError(DownloadErrorKind.NETWORK, str(exc), repo=repo)
    return api.classify(exc, repo, revision, has_token)
