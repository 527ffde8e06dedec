"""Reading parts of a hub file with HTTP Range requests: safetensors headers, and byte ranges of tensors.

Built on the hub's HTTP pieces (`hub.api`: endpoint, token headers, URLs, error classification), so a
range read fails with the same DownloadError kinds and messages as a download, and transient errors are retried
with the same doubling backoff.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, TypeVar

from macapp.core.hub import api
from macapp.core.hub.errors import DownloadError, DownloadErrorKind
from macapp.core.hub.errors import ConnectionDropped
from macapp.core.modelfiles import SafetensorsHeader, header_length, parse_safetensors_header

if TYPE_CHECKING:  # httpx2 is imported when a reader is made
    import httpx2

FIRST_READ = 64 * 1024  # most headers fit (a 40-shard Qwen3.5 repo: ~20-60 KB each): one request, not two
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


@dataclass(frozen=True)
class RemoteHeader:
    path: str
    header: SafetensorsHeader
    etag: str  # the file's ETag as served (sha256 for LFS files): checked again when tensor bytes are fetched


def response_etag(response: httpx2.Response) -> str:
    """The file's etag from a resolve answer (the LFS one when the hub links it), quotes removed."""
    value = response.headers.get("X-Linked-Etag") or response.headers.get("ETag") or ""
    return value.strip().removeprefix("W/").strip('"')


T = TypeVar("T")


def _sleep_on(seconds: float) -> bool:
    """The default wait between attempts: sleep, and never give up early (False)."""
    time.sleep(seconds)
    return False


class RangeReader:
    """One HTTP client for the range reads of one repo at one commit; use as a context manager."""

    def __init__(
        self,
        repo: str,
        commit: str,
        *,
        token: str | None = None,
        timeout: float = 15.0,
        attempts: int = 4,
        backoff_s: float = 0.5,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        import httpx2

        self.repo = repo
        self.commit = commit
        self.token = token if token is not None else api.token()
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self._sleep = sleep or _sleep_on
        self._headers = api.auth_headers(self.token)
        self._base = api.endpoint()
        self.client = httpx2.Client(follow_redirects=True, timeout=httpx2.Timeout(timeout, read=timeout))

    def __enter__(self) -> "RangeReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def url(self, path: str) -> str:
        return api.resolve_url(self.repo, self.commit, path, self._base)

    def error(self, exc: BaseException) -> tuple[bool, DownloadError]:
        if isinstance(exc, ConnectionDropped):
            return True, DownloadError(DownloadErrorKind.NETWORK, str(exc), repo=self.repo)
        return api.classify(exc, self.repo, self.commit, has_token=bool(self.token))

    def retrying(self, what: Callable[[], T]) -> T:
        """`what()`, retried on transient errors (doubling delay); the last error raised as a DownloadError."""
        for attempt in range(1, self.attempts + 1):
            try:
                return what()
            except Exception as exc:
                transient, error = self.error(exc)
                if not transient or attempt == self.attempts:
                    raise error from exc
                if self._sleep(min(self.backoff_s * 2 ** (attempt - 1), 30.0)):
                    raise error from exc
        raise AssertionError("unreachable")

    @contextmanager
    def stream(self, path: str, start: int, end: int) -> Iterator[tuple[httpx2.Response, Iterator[bytes]]]:
        """Bytes [start, end) of `path` as (response, chunks). Refuses an answer that is not that exact range (a server
        ignoring Range would otherwise send the whole file)."""
        from huggingface_hub.utils import hf_raise_for_status

        headers = dict(self._headers, Range=f"bytes={start}-{end - 1}")
        with self.client.stream("GET", self.url(path), headers=headers) as response:
            if response.status_code >= 400:
                response.read()
                hf_raise_for_status(response)
            m = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
            if response.status_code != 206 or not m or int(m[1]) != start or int(m[2]) != end - 1:
                raise DownloadError(
                    DownloadErrorKind.SERVER,
                    f"{self._base} did not answer a range request for {path} of "
                    f"{self.repo} with that range (status {response.status_code}); it cannot serve "
                    "parts of files",
                    repo=self.repo,
                    path=path,
                )
            yield response, response.iter_bytes()

    def read(self, path: str, start: int, end: int) -> tuple[bytes, str]:
        """Bytes [start, end) of `path` and the file's etag, retried on transient errors."""

        def once() -> tuple[bytes, str]:
            with self.stream(path, start, end) as (response, chunks):
                data = b"".join(chunks)
                etag = response_etag(response)
            if len(data) != end - start:
                raise ConnectionDropped(f"{path}: the connection closed after {len(data)} of {end - start} bytes")
            return data, etag

        return self.retrying(once)

    def header(self, path: str, size: int) -> RemoteHeader:
        """The safetensors header of `path` (a file of `size` bytes), by range requests: one when it is short."""
        first, etag = self.read(path, 0, min(size, FIRST_READ))
        n = header_length(first, size)
        raw = first[8 : 8 + n]
        if len(raw) < n:
            rest, etag2 = self.read(path, 8 + len(raw), 8 + n)
            if etag2 != etag:
                raise DownloadError(DownloadErrorKind.INTEGRITY, f"{path} of {self.repo} changed while its header was read", repo=self.repo, path=path)
            raw += rest
        return RemoteHeader(path, parse_safetensors_header(raw), etag)
