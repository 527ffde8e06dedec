"""What the hub answers, told apart: missing repo or revision, gated, private, a refused token, no hub at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from macapp.core import download as dl
from tests.fixtures.downloads import FAST, REPO, SHARD1, SHARD2, is_ready, needed_bytes
from tests.fixtures.hub import random_repo_files


def test_a_hub_that_is_not_there_gives_a_clear_error(hub_server, repo):
    hub_server.stop()
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    assert err.value.kind == "network" and "cannot reach" in str(err.value) and hub_server.url in str(err.value)


def test_missing_repo_and_revision_are_told_apart(hub_server, repo):
    with pytest.raises(dl.DownloadError) as err:
        dl.download("mlx-community/No-Such-Model", settings=FAST)
    assert err.value.kind == "not_found" and "No-Such-Model" in str(err.value) and "HF_TOKEN" in str(err.value)
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, revision="v9", settings=FAST)
    assert err.value.kind == "revision_not_found" and "v9" in str(err.value)


def test_a_gated_repo_asks_for_a_token_and_works_with_one(hub_server, monkeypatch):
    hub_server.add_repo(REPO, random_repo_files(), gated=True)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    assert err.value.kind == "gated" and "HF_TOKEN" in str(err.value) and "hf auth login" in str(err.value)
    assert hub_server.bytes_served() == 0
    monkeypatch.setenv("HF_TOKEN", hub_server.token)
    hub_server.reset_log()
    assert dl.download(REPO, settings=FAST).verified
    assert {r.authorization for r in hub_server.file_requests()} == {f"Bearer {hub_server.token}"}


def test_a_private_repo_without_a_token_and_a_refused_token(hub_server, monkeypatch):
    hub_server.add_repo(REPO, random_repo_files(), private=True)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    assert err.value.kind == "not_found" and "private" in str(err.value) and "HF_TOKEN" in str(err.value)
    monkeypatch.setenv("HF_TOKEN", hub_server.token)
    hub_server.fail(f"*/resolve/*/{SHARD1}", status=401, times=1)
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    assert err.value.kind == "unauthorized" and "token" in str(err.value)


def test_through_a_cdn_redirect_like_the_real_hub_ranges_resume_and_the_token_stays_home(hub_server, monkeypatch):
    hub_server.redirect_lfs = True
    repo = hub_server.add_repo(REPO, random_repo_files(), gated=True)
    monkeypatch.setenv("HF_TOKEN", hub_server.token)
    hub_server.cut(SHARD1, after=600_000)
    dl.download(REPO, settings=FAST)
    content = hub_server.file_requests(SHARD1)
    assert [r.path.startswith("/_cdn/") for r in content] == [True, True]
    assert [r.range for r in content] == [None, "bytes=600000-"]
    assert all(r.authorization is None for r in content)  # the token is not sent to the content host
    redirects = [r for r in hub_server.file_requests(SHARD1, redirects=True) if r.status == 302]
    assert redirects and all(r.authorization == f"Bearer {hub_server.token}" for r in redirects)
    assert hub_server.bytes_served() == needed_bytes(repo) and is_ready(REPO)
    # huggingface_hub itself accepts the stand-in's redirect answers (its HEAD stops at the 302 to another host).
    from huggingface_hub import hf_hub_download

    other = dl.hub_cache_dir().parent / "other-cache"
    path = hf_hub_download(REPO, SHARD2, endpoint=hub_server.url, cache_dir=other, token=hub_server.token)
    assert Path(path).read_bytes() == repo.files[SHARD2].data
    assert Path(path).resolve().name == repo.files[SHARD2].sha256
