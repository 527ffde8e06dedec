"""Moving the bytes of one file: an HTTP Range request appended to our own partial file, hashed as it arrives.

huggingface_hub restarts a file from byte 0 in a new process and deletes its temp file on error; here the partial
file (`blobs/<etag>.incomplete`) survives cancel, errors, crashes and kill -9, and the next request asks for the
bytes after it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from macapp.core.hub.errors import ConnectionDropped, DownloadError, DownloadErrorKind, is_disk_full
from macapp.core.hub.api import RemoteFile
from macapp.core.download.integrity import Hasher, expected_digest, hash_prefix, new_hasher

if TYPE_CHECKING:  # httpx2 is imported by whoever makes the client
    import httpx2

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


@dataclass
class PartialFile:
    """Our partial file for one remote file, and the running hash of the bytes in it."""

    remote: RemoteFile
    path: Path
    done: int = 0
    hasher: Hasher = field(default_factory=hashlib.sha256, repr=False)  # new_hasher(remote): open() and restart() set it

    @classmethod
    def open(cls, remote: RemoteFile, path: Path, cancelled: Callable[[], bool] | None = None) -> "PartialFile":
        """Take up what is already on disk: hash it so the final check covers the whole file."""
        pf = cls(remote, path, 0, new_hasher(remote))
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return pf
        if size > remote.size:
            pf.restart()
            return pf
        # Cancelled midway leaves `done` short of the file; the caller stops, and nothing on disk is lost.
        pf.done = hash_prefix(path, pf.hasher, limit=size, cancelled=cancelled)
        return pf

    def restart(self) -> None:
        self.hasher = new_hasher(self.remote)
        self.done = 0
        with open(self.path, "wb"):
            pass

    @property
    def complete(self) -> bool:
        return self.done == self.remote.size

    def digest_ok(self) -> bool:
        return self.complete and self.hasher.hexdigest() == expected_digest(self.remote)


def _socket_of(response: httpx2.Response) -> socket.socket | None:
    stream = response.extensions.get("network_stream")
    try:
        return stream.get_extra_info("socket") if stream is not None else None
    except Exception:
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fetch_into(
    client: httpx2.Client,
    url: str,
    headers: dict[str, str],
    part: PartialFile,
    *,
    cancelled: Callable[[], bool],
    on_bytes: Callable[[int], None],
    on_socket: Callable[[socket.socket | None], None],
    on_restart: Callable[[], None] | None = None,
) -> None:
    """One request for the rest of `part`. Returns when complete or cancelled; raises on errors (httpx2 transport
    errors and ConnectionDropped are transient; DownloadError and huggingface_hub HTTP errors are not).
    `on_restart` is called when the server ignores the Range header and the file starts again from byte 0."""
    from huggingface_hub.utils import hf_raise_for_status

    remote = part.remote
    if part.complete:
        return
    request_headers = dict(headers)
    if part.done:
        request_headers["Range"] = f"bytes={part.done}-"
    with client.stream("GET", url, headers=request_headers) as response:
        on_socket(_socket_of(response))
        try:
            if cancelled():
                return  # an answer that arrives after a cancel touches nothing on disk
            if response.status_code >= 400:
                response.read()
                hf_raise_for_status(response)
            total = _total_size(response)
            if total is not None and total != remote.size:
                raise DownloadError(
                    DownloadErrorKind.INTEGRITY,
                    f"{remote.path}: the hub listed {remote.size} bytes but the server "
                    f"sends {total}; the listing and the file disagree, so nothing more was fetched",
                    path=remote.path,
                )
            if response.status_code == 206:
                m = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
                if not m or int(m[1]) != part.done:
                    raise ConnectionDropped(f"server answered an unexpected range for {remote.path}")
            elif part.done:
                part.restart()  # the server ignored our Range header and sends the whole file
                if on_restart is not None:
                    on_restart()
            fd = os.open(part.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.lseek(fd, part.done, os.SEEK_SET)
                for chunk in response.iter_bytes():
                    if cancelled():
                        return
                    if not chunk:
                        continue
                    if part.done + len(chunk) > remote.size:
                        raise DownloadError(
                            DownloadErrorKind.INTEGRITY, f"{remote.path}: the server sent more than the {remote.size} bytes the hub listed", path=remote.path
                        )
                    try:
                        _write_all(fd, chunk)
                    except OSError as exc:
                        os.ftruncate(fd, part.done)  # keep the file equal to what was hashed
                        if is_disk_full(exc):
                            why = "the volume refuses a file this large (a FAT32 disk?)" if exc.errno == errno.EFBIG else "the disk filled up"
                            raise DownloadError(DownloadErrorKind.DISK_FULL, why, path=remote.path) from exc
                        raise
                    part.hasher.update(chunk)
                    part.done += len(chunk)
                    on_bytes(len(chunk))
            finally:
                os.close(fd)
        finally:
            on_socket(None)
    if not part.complete and not cancelled():
        raise ConnectionDropped(f"the connection closed after {part.done} of {remote.size} bytes of {remote.path}")


def _total_size(response: httpx2.Response) -> int | None:
    if response.headers.get("Content-Encoding", "identity").lower() not in ("identity", ""):
        return None
    m = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
    if m and m[3] != "*":
        return int(m[3])
    if response.status_code == 200 and response.headers.get("Content-Length"):
        return int(response.headers["Content-Length"])
    return None
