"""Talking to the hub: endpoint, token and offline mode read per call; the file listing; errors made actionable."""

from __future__ import annotations

from dataclasses import dataclass

from macapp.core.hub.errors import TOKEN_HINT, DownloadError, DownloadErrorKind
from macapp.core.hub.settings import hub_settings

TRANSIENT_STATUS = {408, 425, 429, 500, 502, 503, 504}


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repo at a commit, as the hub lists it."""

    path: str
    size: int
    blob_id: str  # git object id
    sha256: str | None = None  # set for LFS files (all weights)

    @property
    def etag(self) -> str:
        """The blob's name in the cache: what huggingface_hub names it after the ETag header."""
        return self.sha256 or self.blob_id

    @property
    def is_weight(self) -> bool:
        return self.path.endswith(".safetensors")


def endpoint() -> str:
    """The hub's URL as the environment says now (macapp.core.hub.settings: huggingface_hub's rules, read per call)."""
    return hub_settings().endpoint


def is_offline() -> bool:
    return hub_settings().offline


def token() -> str | None:
    """HF_TOKEN, else the token `hf auth login` saved."""
    from huggingface_hub import get_token

    return get_token()


def auth_headers(tok: str | None) -> dict[str, str]:
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers(token=tok or False, library_name="qwen-desk")
    headers["Accept-Encoding"] = "identity"  # sizes and byte offsets must be those of the file itself
    return headers


def resolve_url(repo: str, commit: str, path: str, base: str | None = None) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo, path, revision=commit, endpoint=base or endpoint())


@dataclass(frozen=True)
class Listing:
    repo: str
    revision: str
    commit: str
    files: list[RemoteFile]  # every file of the repo at that commit


def fetch_listing(repo: str, revision: str, tok: str | None, base: str | None = None, timeout: float = 15.0) -> Listing:
    """One call (`model_info(files_metadata=True)`) gives the commit and every file's size and hash."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=base or endpoint(), token=tok or False, library_name="qwen-desk")
    info = api.model_info(repo, revision=revision, files_metadata=True, timeout=timeout)
    if not info.sha:
        raise DownloadError(DownloadErrorKind.SERVER, f"the hub's answer for {repo} has no commit id; is HF_ENDPOINT a hub?", repo=repo)
    files = []
    for s in info.siblings or []:
        if s.size is None or not s.blob_id:
            raise DownloadError(DownloadErrorKind.SERVER, f"the hub listed {s.rfilename} of {repo} without its size or id", repo=repo)
        files.append(
            RemoteFile(path=s.rfilename, size=int(s.lfs.size if s.lfs else s.size), blob_id=s.blob_id, sha256=(s.lfs.sha256.lower() if s.lfs else None))
        )
    return Listing(repo=repo, revision=revision, commit=info.sha, files=files)


def classify(exc: BaseException, repo: str, revision: str = "main", has_token: bool = False) -> tuple[bool, DownloadError]:
    """(transient?, the error to show). Transient errors are worth a retry; the others end the download."""
    import httpx2
    from huggingface_hub import errors as hf

    where = endpoint()
    if isinstance(exc, DownloadError):
        return False, exc
    if isinstance(exc, hf.OfflineModeIsEnabled):
        return False, DownloadError(
            DownloadErrorKind.OFFLINE,
            f"{repo} is not fully downloaded and HF_HUB_OFFLINE is set: unset it (or set HF_HUB_OFFLINE=0) and run the download again",
            repo=repo,
        )
    if isinstance(exc, hf.GatedRepoError):
        if has_token:
            msg = f"{repo} is gated and your token has no access yet: accept its terms at {where}/{repo} with the account the token belongs to, then retry"
        else:
            msg = f"{repo} is gated: accept its terms at {where}/{repo}, then {TOKEN_HINT}"
        return False, DownloadError(DownloadErrorKind.GATED, msg, repo=repo)
    if isinstance(exc, hf.RepositoryNotFoundError):
        if has_token:
            msg = f"{repo} was not found on {where} (or your token cannot see it): check the name"
        else:
            msg = f"{repo} was not found on {where}: check the name; if it is private, {TOKEN_HINT}"
        return False, DownloadError(DownloadErrorKind.NOT_FOUND, msg, repo=repo)
    if isinstance(exc, hf.RevisionNotFoundError):
        return False, DownloadError(DownloadErrorKind.REVISION_NOT_FOUND, f"{repo} has no revision {revision!r} (branch, tag or commit)", repo=repo)
    if isinstance(exc, hf.RemoteEntryNotFoundError):
        return False, DownloadError(DownloadErrorKind.NOT_FOUND, f"a file the hub listed for {repo} is missing on the server: {exc}", repo=repo)
    if isinstance(exc, hf.HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        if status in (401, 403):
            hint = "check that the token is valid and allowed to read this repo" if has_token else TOKEN_HINT
            return False, DownloadError(DownloadErrorKind.UNAUTHORIZED, f"the hub refused access to {repo} ({status}): {hint}", repo=repo)
        if status in TRANSIENT_STATUS:
            return True, DownloadError(DownloadErrorKind.SERVER, f"the hub answered {status} for {repo}; try again later", repo=repo)
        return False, DownloadError(DownloadErrorKind.SERVER, f"the hub answered {status} for {repo}: {exc}", repo=repo)
    if isinstance(exc, (httpx2.ProxyError,)):
        return False, DownloadError(DownloadErrorKind.NETWORK, f"the proxy refused the connection to {where}: {exc}", repo=repo)
    if isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout)):
        return True, DownloadError(DownloadErrorKind.NETWORK, f"cannot reach {where} ({exc or type(exc).__name__}); check the connection", repo=repo)
    if isinstance(exc, httpx2.ReadTimeout):
        return True, DownloadError(DownloadErrorKind.NETWORK, f"no data from {where} for too long (stalled transfer)", repo=repo)
    if isinstance(exc, httpx2.TransportError):
        return True, DownloadError(DownloadErrorKind.NETWORK, f"the connection to {where} dropped ({type(exc).__name__}: {exc or 'no detail'})", repo=repo)
    return False, DownloadError(DownloadErrorKind.SERVER, f"unexpected answer from {where} for {repo}: {type(exc).__name__}: {exc}", repo=repo)
