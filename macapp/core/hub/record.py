"""One typed record of what a hub model repo holds, read once from the hub and cached once on disk.

A record is the repo at one commit: its config.json, every file's size and etag, every safetensors tensor (name,
file, dtype, shape, absolute byte range, role) from the headers read by HTTP Range requests (no tensor data), and
preprocessor_config.json when the build can see. The catalog takes sizes from it, vision "can it see", and the
MTP head its bytes and byte ranges. Cached in `<app cache>/hub-records.json`, keyed by repo.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from macapp.core import paths
from macapp.core.hub import api
from macapp.core.jsonvalue import JSONObject
from macapp.core.hub.remote import RangeReader
from macapp.core.tensor_roles import TensorRole, tensor_role, tied_embeddings
from macapp.core.vision.capability import has_vision_config

RECORDS_CACHE = "hub-records.json"
SMALL_FILES_CACHE = "hub-configs"  # config.json / preprocessor_config.json, kept out of the shared HF cache
_BASE_MODEL = re.compile(r"^base_model:\s*(?:\n\s*-\s*)?['\"]?([\w.\-]+/[\w.\-]+)", re.M)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    etag: str  # what the hub serves as ETag: the sha256 of an LFS file, else its git blob id
    header_bytes: int = 0  # a safetensors file's 8-byte length plus JSON header (0: not read or not safetensors)


@dataclass(frozen=True)
class HubTensor:
    name: str
    file: str
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file (the header included)
    end: int
    role: TensorRole

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class HubModelRecord:
    repo: str
    revision: str  # the commit it was read at
    config: JSONObject
    files: tuple[HubFile, ...]
    tensors: tuple[HubTensor, ...] = ()
    processor: JSONObject = field(default_factory=dict)  # preprocessor_config.json ({}: none, or text-only)
    headers_error: str = ""  # why the tensors are not known ("" when every safetensors header was read)
    fetched_at: float = 0.0
    base_model: str = ""  # the model card's base_model (what a conversion was made from), "" when it names none

    @property
    def file_sizes(self) -> dict[str, int]:
        return {f.path: f.size for f in self.files}

    def file(self, path: str) -> HubFile | None:
        return next((f for f in self.files if f.path == path), None)

    @property
    def headers_read(self) -> bool:
        return not self.headers_error

    def role_bytes(self, role: TensorRole) -> int:
        return sum(t.nbytes for t in self.tensors if t.role is role)

    def role_tensors(self, role: TensorRole) -> tuple[HubTensor, ...]:
        return tuple(t for t in self.tensors if t.role is role)

    @property
    def mtp_bytes(self) -> int:
        return self.role_bytes(TensorRole.MTP)

    @property
    def has_mtp(self) -> bool:
        return any(t.role is TensorRole.MTP for t in self.tensors)

    @property
    def weights_bytes(self) -> int | None:
        """Bytes mlx-lm loads (the language tensors); the safetensors files' sizes when the headers were unreadable."""
        if self.headers_read and self.tensors:
            return self.role_bytes(TensorRole.LANGUAGE) or None
        return sum(f.size for f in self.files if f.path.endswith(".safetensors")) or None

    def to_json(self) -> JSONObject:
        return {
            "repo": self.repo,
            "revision": self.revision,
            "config": self.config,
            "files": [[f.path, f.size, f.etag, f.header_bytes] for f in self.files],
            "tensors": [[t.name, t.file, t.dtype, list(t.shape), t.start, t.end] for t in self.tensors],
            "processor": self.processor,
            "headers_error": self.headers_error,
            "fetched_at": self.fetched_at,
            "base_model": self.base_model,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "HubModelRecord":
        config = data.get("config") or {}
        tied = tied_embeddings(config)
        return cls(
            repo=data["repo"],
            revision=data["revision"],
            config=config,
            files=tuple(HubFile(p, int(s), str(e), int(h)) for p, s, e, h in data.get("files") or []),
            tensors=tuple(HubTensor(n, f, d, tuple(sh), int(a), int(b), tensor_role(n, tied)) for n, f, d, sh, a, b in data.get("tensors") or []),
            processor=data.get("processor") or {},
            headers_error=data.get("headers_error", ""),
            fetched_at=float(data.get("fetched_at", 0.0)),
            base_model=str(data.get("base_model") or ""),
        )


def weight_file_paths(files: Iterable[HubFile]) -> list[str]:
    """The safetensors files the loaders read: those at the top of the repo (they glob `*.safetensors`)."""
    return sorted(f.path for f in files if f.path.endswith(".safetensors") and "/" not in f.path)


def readme_base_model(readme: str) -> str | None:
    """The ``base_model`` of a model card's YAML front matter (the first, when it lists several)."""
    parts = readme.split("---", 2)
    front = parts[1] if readme.startswith("---") and len(parts) == 3 else ""
    m = _BASE_MODEL.search(front)
    return m.group(1) if m else None


# --- reading it from the hub ----------------------------------------------------------------------------------------
def _small_file(repo: str, commit: str, name: str, required: bool) -> str | None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        path = hf_hub_download(repo, name, revision=commit, endpoint=api.endpoint(), cache_dir=paths.cache_dir() / SMALL_FILES_CACHE)
    except EntryNotFoundError:
        if required:
            raise
        return None
    return Path(path).read_text()


def _small_json(repo: str, commit: str, name: str, required: bool) -> JSONObject:
    text = _small_file(repo, commit, name, required)
    data = json.loads(text) if text is not None else {}
    return data if isinstance(data, dict) else {}


def fetch_record(repo: str, revision: str = "main", token: str | None = None, timeout: float = 15.0, known: HubModelRecord | None = None) -> HubModelRecord:
    """Read a repo from the hub: listing and config (their errors raise as huggingface_hub / DownloadError errors),
    then the safetensors headers (a failure there is kept in `headers_error`), then the processor of a seeing build.
    `known` (a record read earlier) is returned as it is when the repo is still at its commit: only the listing is asked."""
    tok = token if token is not None else api.token()
    listing = api.fetch_listing(repo, revision, tok, timeout=timeout)
    if known is not None and known.repo == repo and known.revision == listing.commit and known.headers_read:
        return known
    config = _small_json(repo, listing.commit, "config.json", required=True)
    tied = tied_embeddings(config)
    files = {f.path: HubFile(f.path, f.size, f.etag) for f in listing.files}
    tensors: list[HubTensor] = []
    error = ""
    try:
        with RangeReader(repo, listing.commit, token=tok, timeout=timeout) as reader:
            for path in weight_file_paths(files.values()):
                remote = reader.header(path, files[path].size)
                files[path] = HubFile(path, files[path].size, files[path].etag, remote.header.header_bytes)
                base = remote.header.header_bytes
                tensors += [
                    HubTensor(name, path, info.dtype, info.shape, base + info.start, base + info.end, tensor_role(name, tied))
                    for name, info in remote.header.info.items()
                ]
    except Exception as exc:  # no headers: sizes fall back to the files'
        error = f"{type(exc).__name__}: {exc}"
        tensors = []
    sees = has_vision_config(config) and any(t.role is TensorRole.VISION for t in tensors)
    processor = _small_json(repo, listing.commit, "preprocessor_config.json", required=False) if sees else {}
    card = _small_file(repo, listing.commit, "README.md", required=False) if "README.md" in files else None
    return HubModelRecord(
        repo=repo,
        revision=listing.commit,
        config=config,
        files=tuple(files.values()),
        tensors=tuple(tensors),
        processor=processor,
        headers_error=error,
        fetched_at=time.time(),
        base_model=readme_base_model(card or "") or "",
    )


# --- the cache on disk ------------------------------------------------------------------------------------------------
def _cache_path() -> Path:
    return paths.cache_dir() / RECORDS_CACHE


_MEMO: dict[str, tuple[tuple[int, int], JSONObject]] = {}  # path -> ((mtime_ns, size), parsed): parsed once per change


_PARSED: dict[str, tuple[tuple[int, int], "HubModelRecord | None"]] = {}  # cache path + repo -> (stamp, record)


def records_stamp() -> tuple[int, int]:
    """(mtime_ns, size) of the records cache: changes whenever a record is stored."""
    try:
        st = _cache_path().stat()
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


def _read_all() -> JSONObject:
    path = _cache_path()
    stamp = records_stamp()
    hit = _MEMO.get(str(path))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data = data if isinstance(data, dict) else {}
    _MEMO[str(path)] = (stamp, data)
    return data


def cached_record(repo: str | None) -> HubModelRecord | None:
    """The record last fetched for `repo`, or None (never fetched, or an unreadable cache entry)."""
    stamp = records_stamp()
    key = f"{_cache_path()}\0{repo or ''}"
    hit = _PARSED.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    raw = _read_all().get(repo or "")
    record = None
    if isinstance(raw, dict):
        try:
            record = HubModelRecord.from_json(raw)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("ignoring the cached hub record of %s: %s", repo, exc)
    _PARSED[key] = (stamp, record)
    return record


def store_records(records: Iterable[HubModelRecord]) -> None:
    """Add (or replace) records in the cache, written atomically (another reader never sees half a file)."""
    data = dict(_read_all())
    for record in records:
        data[record.repo] = record.to_json()
    path = _cache_path()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def refresh_records(repos: Iterable[str]) -> tuple[dict[str, HubModelRecord], dict[str, str]]:
    """Fetch each repo's record and cache those read; returns (repo → record, repo → error for the failures)."""
    records: dict[str, HubModelRecord] = {}
    errors: dict[str, str] = {}
    for repo in dict.fromkeys(repos):
        try:
            records[repo] = fetch_record(repo)
        except Exception as exc:  # one unreachable repo must not stop the rest
            errors[repo] = f"{type(exc).__name__}: {exc}"
    if records:
        store_records(records.values())
    return records, errors


def record_for(repo: str, refresh: bool = False) -> HubModelRecord:
    """The cached record, or one fetched now (and cached) when there is none or `refresh`."""
    if not refresh:
        hit = cached_record(repo)
        if hit is not None:
            return hit
    record = fetch_record(repo)
    store_records([record])
    return record
