"""Checking a file against the hub's listing: sha256 for LFS files (all weights), the git blob id for small ones."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable, Protocol

from macapp.core.hub.api import RemoteFile

READ_CHUNK = 4 * 1024 * 1024


class Hasher(Protocol):
    """A running hash (hashlib's sha256 or sha1 object)."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def new_hasher(remote: RemoteFile) -> Hasher:
    """A hashlib object that, fed the file's bytes, ends with the digest the listing gives."""
    if remote.sha256:
        return hashlib.sha256()
    h = hashlib.sha1()
    h.update(b"blob %d\0" % remote.size)  # git's object header: the blob id hashes it before the content
    return h


def expected_digest(remote: RemoteFile) -> str:
    return (remote.sha256 or remote.blob_id).lower()


def hash_prefix(
    path: Path, hasher: Hasher, limit: int | None = None, on_bytes: Callable[[int], None] | None = None, cancelled: Callable[[], bool] | None = None
) -> int:
    """Feed the first `limit` bytes of `path` (all when None) into `hasher`; returns bytes read."""
    read = 0
    with open(path, "rb") as fh:
        while limit is None or read < limit:
            if cancelled is not None and cancelled():
                break
            n = READ_CHUNK if limit is None else min(READ_CHUNK, limit - read)
            chunk = fh.read(n)
            if not chunk:
                break
            hasher.update(chunk)
            read += len(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return read


def file_matches(path: Path, remote: RemoteFile, on_bytes: Callable[[int], None] | None = None, cancelled: Callable[[], bool] | None = None) -> bool | None:
    """True when the file's size and hash match the listing, False when not, None when cancelled midway."""
    if path.stat().st_size != remote.size:
        return False
    hasher = new_hasher(remote)
    read = hash_prefix(path, hasher, on_bytes=on_bytes, cancelled=cancelled)
    if read != remote.size:
        return None if cancelled is not None and cancelled() else False
    return bool(hasher.hexdigest() == expected_digest(remote))
