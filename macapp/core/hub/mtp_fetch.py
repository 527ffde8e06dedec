"""Fetching the MTP head a build lacks: only the `mtp.*` byte ranges of the original repo's shards, resumable and
verified, quantized like the build and written atomically to the side file (`modelfiles.mtp_side_file`).

What is verified (no per-tensor hash is published, so not the bytes themselves):
- the repo is read at one commit (every URL names it), so the files cannot change between header and data;
- every data answer carries the ETag the listing gave for that file (the sha256 of an LFS file) and the exact
  Content-Range asked for;
- the bytes received per range equal the header's offsets, and each tensor's length equals its shape × dtype;
- the assembled tensors parse as safetensors (MLX checks shape and dtype against the bytes again).

Resumable: the bytes go, in range order, to `<side file>.part`, with `<side file>.part.json` naming the commit and
ranges; a later run asks only for the bytes after what the .part holds (it is fsync'd at each range and on any
stop, so a kill -9 loses at most the unsynced tail, which the size tells). The side file appears only whole
(written to a temporary name, fsync'd, renamed).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from macapp.core.hub import api
from macapp.core.hub.errors import RESUME_HINT, DownloadCancelled, DownloadError, DownloadErrorKind, is_disk_full
from macapp.core.download.hfcache import free_bytes
from macapp.core.download.manager import CancelToken
from macapp.core.hub.errors import ConnectionDropped
from macapp.core.hub.mtp import SIDE_FILE_MARK, folder_rule, source_repo_for
from macapp.core.hub.mtp_quant import DTYPE_BYTES, QuantRule
from macapp.core.jsonvalue import JSONObject
from macapp.core.hub.record import HubModelRecord, HubTensor, cached_record, fetch_record, store_records
from macapp.core.hub.remote import RangeReader, response_etag
from macapp.core.memory import format_bytes
from macapp.core.modelfiles import mtp_side_file
from macapp.core.tensor_roles import TensorRole

if TYPE_CHECKING:
    import mlx.core as mx

DISK_MARGIN = 64 * 1024**2
FSYNC_EVERY = 8 * 1024**2


@dataclass(frozen=True)
class ByteRange:
    file: str
    start: int  # absolute offsets in the file
    end: int
    etag: str  # the file's ETag in the listing: every answer must carry it

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class MtpFetchPlan:
    folder: Path  # the build
    side_file: Path
    source_repo: str
    commit: str
    tensors: tuple[HubTensor, ...]  # the head in the source, in (file, offset) order
    ranges: tuple[ByteRange, ...]  # the tensors' bytes, neighbours merged into one request
    rule: QuantRule  # how the build is quantized

    @property
    def fetch_bytes(self) -> int:
        return sum(r.size for r in self.ranges)

    @property
    def head_bytes(self) -> int:
        return sum(self.rule.stored_bytes(t.name, t.shape) for t in self.tensors)

    @property
    def part_path(self) -> Path:
        return self.side_file.with_name(self.side_file.name + ".part")

    @property
    def state_path(self) -> Path:
        return self.side_file.with_name(self.side_file.name + ".part.json")

    def state(self) -> JSONObject:
        return {"source_repo": self.source_repo, "commit": self.commit, "ranges": [[r.file, r.start, r.end, r.etag] for r in self.ranges]}


@dataclass(frozen=True)
class MtpFetchResult:
    side_file: Path
    source_repo: str
    commit: str
    tensors: int
    bytes_total: int  # the head's bytes in the source
    bytes_fetched_this_run: int
    resumed_bytes: int  # found in the .part from an earlier run
    head_bytes: int  # the side file's tensor bytes (quantized)

    def to_json(self) -> dict[str, object]:
        return {
            "side_file": str(self.side_file),
            "source_repo": self.source_repo,
            "commit": self.commit,
            "tensors": self.tensors,
            "bytes_total": self.bytes_total,
            "bytes_fetched_this_run": self.bytes_fetched_this_run,
            "resumed_bytes": self.resumed_bytes,
            "head_bytes": self.head_bytes,
        }


def merged_ranges(tensors: list[HubTensor], etags: dict[str, str]) -> tuple[ByteRange, ...]:
    out: list[ByteRange] = []
    for t in tensors:
        if out and out[-1].file == t.file and out[-1].end == t.start:
            out[-1] = ByteRange(t.file, out[-1].start, t.end, out[-1].etag)
        else:
            out.append(ByteRange(t.file, t.start, t.end, etags[t.file]))
    return tuple(out)


def _read_state(path: Path) -> JSONObject | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def plan_mtp_fetch(folder: Path, build_repo: str | None = None, source_repo: str | None = None, token: str | None = None) -> MtpFetchPlan:
    """What to fetch for the build in `folder`: the source repo's MTP tensors (at the commit an unfinished fetch
    started from, else its main branch). DownloadError when no source is known, it cannot be read, or it has no head."""
    folder = Path(folder)
    side = mtp_side_file(folder)
    source = source_repo or source_repo_for(build_repo, folder)
    if source is None and build_repo:
        source = _card_base_model(build_repo, token) or None
    if source is None:
        raise DownloadError(
            DownloadErrorKind.NOT_FOUND,
            f"no original repo is known for {build_repo or folder.name} (not in the catalog, no base_model in its card): name it with --mtp-from Qwen/<model>",
            repo=build_repo,
        )
    earlier = _read_state(side.with_name(side.name + ".part.json"))
    commit = earlier.get("commit") if earlier and earlier.get("source_repo") == source else None
    revision = commit if isinstance(commit, str) and commit else "main"
    record = _source_record(source, revision, token)
    store_records([record])  # the fit and the library then know the bytes to fetch without asking again
    if not record.headers_read:
        raise DownloadError(DownloadErrorKind.SERVER, f"could not read the safetensors headers of {source}: {record.headers_error}", repo=source)
    tensors = sorted(record.role_tensors(TensorRole.MTP), key=lambda t: (t.file, t.start))
    if not tensors:
        raise DownloadError(
            DownloadErrorKind.NOT_FOUND,
            f"{source} has no MTP head (no mtp.* tensors in its safetensors files): there is nothing to fetch for this build",
            repo=source,
        )
    etags = {f.path: f.etag for f in record.files}
    return MtpFetchPlan(
        folder=folder,
        side_file=side,
        source_repo=source,
        commit=record.revision,
        tensors=tuple(tensors),
        ranges=merged_ranges(tensors, etags),
        rule=folder_rule(folder),
    )


def _card_base_model(build_repo: str, token: str | None) -> str:
    """The build's card's base_model, from its hub record (read now, and cached, when there is none yet)."""
    record = cached_record(build_repo)
    if record is None:
        record = _source_record(build_repo, "main", token)
        store_records([record])
    return record.base_model


def _source_record(source: str, revision: str, token: str | None) -> HubModelRecord:
    try:
        return fetch_record(source, revision, token=token, known=cached_record(source))
    except DownloadError:
        raise
    except Exception as exc:
        raise api.classify(exc, source, revision, has_token=bool(token if token is not None else api.token()))[1] from exc


# --- fetching --------------------------------------------------------------------------------------------------------
def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError:
        pass


def _disk_error(exc: OSError, plan: MtpFetchPlan, kept: int) -> DownloadError:
    why = "the volume refuses a file this large" if exc.errno == errno.EFBIG else "the disk filled up"
    return DownloadError(
        DownloadErrorKind.DISK_FULL,
        f"{why} while fetching the MTP head of {plan.source_repo} into {plan.side_file.parent}: "
        f"{format_bytes(kept)} are kept; free some space and run it again to resume",
        repo=plan.source_repo,
        bytes_kept=kept,
    )


class _Fetcher:
    def __init__(self, plan: MtpFetchPlan, reader: RangeReader, cancel: CancelToken, on_progress: Callable[[int, int], None]) -> None:
        self.plan, self.reader, self.cancel, self.on_progress = plan, reader, cancel, on_progress
        self.total = plan.fetch_bytes
        self.done = 0

    def run(self, fd: int, start_at: int) -> None:
        self.done = start_at
        offset = 0
        for rng in self.plan.ranges:
            if offset + rng.size > self.done:
                self._range(fd, rng, offset)
            offset += rng.size
            _fsync(fd)

    def _range(self, fd: int, rng: ByteRange, offset: int) -> None:
        failures = 0
        while self.done < offset + rng.size:
            if self.cancel.cancelled:
                raise DownloadCancelled(f"MTP fetch of {self.plan.source_repo} stopped; {RESUME_HINT}", repo=self.plan.source_repo, bytes_kept=self.done)
            before = self.done
            try:
                self._stream(fd, rng, offset)
            except DownloadError:
                raise
            except OSError as exc:
                if is_disk_full(exc):
                    raise _disk_error(exc, self.plan, self.done) from exc
                raise
            except Exception as exc:
                transient, error = self.reader.error(exc)
                failures = 1 if self.done > before else failures + 1
                if not transient or failures >= self.reader.attempts:
                    error.bytes_kept = self.done
                    raise error from exc
                self.cancel.wait(min(self.reader.backoff_s * 2 ** (failures - 1), 30.0))  # a cancel ends the loop at its top

    def _stream(self, fd: int, rng: ByteRange, offset: int) -> None:
        start = rng.start + (self.done - offset)
        synced = self.done
        with self.reader.stream(rng.file, start, rng.end) as (response, chunks):
            served = response_etag(response)
            if served != rng.etag:
                raise DownloadError(
                    DownloadErrorKind.INTEGRITY,
                    f"{rng.file} of {self.plan.source_repo} is served with ETag {served or '(none)'}, "
                    f"not the {rng.etag} its listing gave: the file changed, so nothing more was fetched",
                    repo=self.plan.source_repo,
                    path=rng.file,
                )
            for chunk in chunks:
                if self.cancel.cancelled:
                    return
                room = offset + rng.size - self.done
                if len(chunk) > room:
                    raise DownloadError(
                        DownloadErrorKind.INTEGRITY, f"{rng.file}: the server sent more than the range asked for", repo=self.plan.source_repo, path=rng.file
                    )
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
                self.done += len(chunk)
                self.on_progress(self.done, self.total)
                if self.done - synced >= FSYNC_EVERY:
                    _fsync(fd)
                    synced = self.done
        if self.done < offset + rng.size and not self.cancel.cancelled:
            raise ConnectionDropped(f"the connection closed {offset + rng.size - self.done} bytes short in {rng.file}")


def _resume_point(plan: MtpFetchPlan) -> int:
    """Bytes of the .part to keep: all of it when it was written for this very plan, else none."""
    if _read_state(plan.state_path) != plan.state():
        plan.part_path.unlink(missing_ok=True)
        tmp = plan.state_path.with_name(plan.state_path.name + ".tmp")
        tmp.write_text(json.dumps(plan.state()))
        os.replace(tmp, plan.state_path)
        return 0
    try:
        size = plan.part_path.stat().st_size
    except FileNotFoundError:
        return 0
    return size if size <= plan.fetch_bytes else 0


def fetch_mtp_head(
    plan: MtpFetchPlan,
    *,
    on_progress: Callable[[int, int], None] | None = None,
    cancel: CancelToken | None = None,
    token: str | None = None,
    attempts: int = 6,
    backoff_s: float = 1.0,
) -> MtpFetchResult:
    """Fetch the planned ranges (resuming an earlier .part), then write the side file. DownloadError (with `kind`)
    or DownloadCancelled when it cannot finish; the .part is kept for the next run either way."""
    cancel = cancel or CancelToken()
    progress = on_progress or (lambda done, total: None)
    plan.side_file.parent.mkdir(parents=True, exist_ok=True)
    resumed = _resume_point(plan)
    need = plan.fetch_bytes - resumed + plan.head_bytes + DISK_MARGIN
    free = free_bytes(plan.side_file.parent)
    if free < need:
        raise DownloadError(
            DownloadErrorKind.DISK_FULL,
            f"not enough disk space for the MTP head of {plan.source_repo}: "
            f"{format_bytes(need)} needed, {format_bytes(free)} free on the volume of {plan.side_file.parent}",
            repo=plan.source_repo,
            bytes_kept=resumed,
        )
    fd = os.open(plan.part_path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, resumed)
        os.lseek(fd, resumed, os.SEEK_SET)
        with RangeReader(plan.source_repo, plan.commit, token=token, attempts=attempts, backoff_s=backoff_s, sleep=cancel.wait) as reader:
            fetcher = _Fetcher(plan, reader, cancel, progress)
            progress(resumed, plan.fetch_bytes)
            fetcher.run(fd, resumed)
        if fetcher.done < plan.fetch_bytes:
            raise DownloadCancelled(
                f"MTP fetch of {plan.source_repo} stopped at {format_bytes(fetcher.done)}; {RESUME_HINT}", repo=plan.source_repo, bytes_kept=fetcher.done
            )
    except OSError as exc:
        if is_disk_full(exc):
            raise _disk_error(exc, plan, os.fstat(fd).st_size) from exc
        raise
    finally:
        _fsync(fd)
        os.close(fd)
    head = write_side_file(plan)
    plan.part_path.unlink(missing_ok=True)
    plan.state_path.unlink(missing_ok=True)
    return MtpFetchResult(
        side_file=plan.side_file,
        source_repo=plan.source_repo,
        commit=plan.commit,
        tensors=len(plan.tensors),
        bytes_total=plan.fetch_bytes,
        bytes_fetched_this_run=plan.fetch_bytes - resumed,
        resumed_bytes=resumed,
        head_bytes=head,
    )


# --- assembling and writing ------------------------------------------------------------------------------------------
def _source_tensors(plan: MtpFetchPlan) -> tuple[dict[str, mx.array], dict[str, str]]:
    """The fetched tensors as MLX arrays (their source dtype), and the sha256 of each one's bytes."""
    import mlx.core as mx

    data = plan.part_path.read_bytes()
    if len(data) != plan.fetch_bytes:
        raise DownloadError(DownloadErrorKind.INTEGRITY, f"the fetched MTP bytes are {len(data)}, not {plan.fetch_bytes}", repo=plan.source_repo)
    header: JSONObject = {}
    digests: dict[str, str] = {}
    pos = 0
    for t in plan.tensors:
        expected = DTYPE_BYTES.get(t.dtype, 0) * prod(t.shape)
        if t.dtype not in DTYPE_BYTES or expected != t.nbytes:
            raise DownloadError(
                DownloadErrorKind.INTEGRITY,
                f"{t.name} in {plan.source_repo}: {t.nbytes} bytes for a {t.dtype} {list(t.shape)} tensor; the header disagrees with itself",
                repo=plan.source_repo,
                path=t.file,
            )
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [pos, pos + t.nbytes]}
        digests[t.name] = hashlib.sha256(data[pos : pos + t.nbytes]).hexdigest()
        pos += t.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    staging = plan.side_file.with_name(plan.side_file.name + ".source.safetensors")
    staging.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    try:
        arrays = mx.load(str(staging))
        if not isinstance(arrays, dict):  # a .safetensors file loads as {name: array}
            raise DownloadError(DownloadErrorKind.INTEGRITY, "the fetched MTP tensors did not load as named tensors", repo=plan.source_repo)
        mx.eval(list(arrays.values()))
    finally:
        staging.unlink(missing_ok=True)
    return arrays, digests


def write_side_file(plan: MtpFetchPlan) -> int:
    """Quantize the fetched head like the build and write the side file atomically; returns its tensor bytes."""
    import mlx.core as mx

    arrays, digests = _source_tensors(plan)
    quantized = plan.rule.quantize(arrays)
    etags = {r.file: r.etag for r in plan.ranges}
    metadata = {
        "format": "mlx",
        SIDE_FILE_MARK: plan.source_repo,
        "qwen_desk.mtp.source_revision": plan.commit,
        "qwen_desk.mtp.source_etags": json.dumps(etags, sort_keys=True),
        "qwen_desk.mtp.source_sha256": json.dumps(digests, sort_keys=True),
        "qwen_desk.mtp.bits": "" if plan.rule.bits is None else str(plan.rule.bits),
        "qwen_desk.mtp.group_size": str(plan.rule.group_size),
        "qwen_desk.mtp.dtype": plan.rule.dtype,
        "qwen_desk.mtp.fetched_at": str(int(time.time())),
    }
    tmp = plan.side_file.with_name(f".{plan.side_file.stem}.{os.getpid()}.tmp.safetensors")
    try:
        mx.save_safetensors(str(tmp), quantized, metadata=metadata)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, plan.side_file)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if is_disk_full(exc):
            raise _disk_error(exc, plan, plan.fetch_bytes) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(plan.side_file.parent, os.O_RDONLY)
    try:
        _fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return sum(v.nbytes for v in quantized.values())
