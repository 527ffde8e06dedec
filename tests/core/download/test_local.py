"""What is already downloaded, read from the cache alone: offline use, listing, deleting, what counts as complete."""

from __future__ import annotations

import pytest

from macapp.core import download as dl
from macapp.core.download import hfcache
from macapp.core.hub.api import RemoteFile
from tests.fixtures.downloads import FAST, NEEDED, REPO, SHARD1, SHARD2, blob_of, is_ready, needed_bytes


def test_offline_a_ready_model_is_ready_and_a_missing_one_says_offline(hub_server, repo, monkeypatch):
    dl.download(REPO, settings=FAST)
    hub_server.reset_log()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = dl.download(REPO, settings=FAST)
    assert result.verified and result.bytes_downloaded_this_run == 0 and hub_server.log == []
    with pytest.raises(dl.DownloadError) as err:
        dl.download("mlx-community/Other-4bit", settings=FAST)
    assert err.value.kind == "offline" and "HF_HUB_OFFLINE" in str(err.value)


def test_an_unreachable_hub_still_serves_a_complete_local_model(hub_server, repo):
    dl.download(REPO, settings=FAST)
    hub_server.stop()
    plan = dl.plan_download(REPO)
    assert plan.from_cache_only and plan.ready
    assert dl.download(plan, settings=FAST).bytes_downloaded_this_run == 0


def test_offline_a_model_without_a_stored_listing_is_still_checked_by_its_blob_names(hub_server, repo, monkeypatch):
    # As left by an older huggingface_hub, which kept no trees/ listing: the blob names are the hashes.
    import shutil

    from huggingface_hub import snapshot_download

    snapshot_download(REPO, endpoint=hub_server.url, cache_dir=dl.hub_cache_dir(), allow_patterns=dl.NEEDED_PATTERNS)
    shutil.rmtree(hfcache.repo_dir(REPO) / "trees")
    hub_server.reset_log()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = dl.download(REPO, settings=FAST)
    assert result.verified and set(result.files) == NEEDED and hub_server.log == []
    assert is_ready(REPO)
    blob = blob_of(repo, SHARD2)
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    assert err.value.kind == "offline" and SHARD2 in str(err.value) and hub_server.log == []


def test_list_shows_partial_downloads_and_delete_removes_everything(hub_server, repo):
    hub_server.cut(SHARD1, after=250_000)
    with pytest.raises(dl.DownloadError):  # one file at a time, no retry: stops after 250 kB of the first shard
        dl.download(REPO, settings=dl.DownloadSettings(**{**FAST.__dict__, "attempts": 1, "max_workers": 1}))
    [partial] = dl.list_downloaded()
    assert not partial.complete and partial.partial_bytes == 250_000 and REPO not in dl.downloaded_repos()
    assert partial.commit == repo.commit and partial.bytes_total == needed_bytes(repo)
    hub_server.clear_faults()
    dl.download(REPO, settings=FAST)
    [full] = dl.list_downloaded()
    assert full.ready and full.partial_bytes == 0 and full.bytes_on_disk >= needed_bytes(repo)
    assert dl.delete_model(REPO) >= needed_bytes(repo)
    assert dl.list_downloaded() == [] and not hfcache.repo_dir(REPO).exists() and not is_ready(REPO)


def test_a_cache_folder_holding_only_config_json_is_not_a_downloaded_model(hub_server, repo):
    from huggingface_hub import hf_hub_download

    # What a tool reading one config leaves behind: refs/main and a snapshot with config.json alone (no listing).
    hf_hub_download(REPO, "config.json", endpoint=hub_server.url, cache_dir=dl.hub_cache_dir())
    rdir = hfcache.repo_dir(REPO)
    assert (rdir / "snapshots" / repo.commit / "config.json").is_file() and not (rdir / "trees").exists()
    local = dl.inspect_repo(REPO)
    assert local is not None and not local.complete and not local.ready
    assert REPO not in dl.downloaded_repos() and not is_ready(REPO)
    [listed] = dl.list_downloaded()
    assert listed.repo == REPO and not listed.complete  # shown as started, not as a model
    # The same folder with the tokenizer too but no weights (no index, no model.safetensors): still not a model.
    hf_hub_download(REPO, "tokenizer.json", endpoint=hub_server.url, cache_dir=dl.hub_cache_dir())
    assert not dl.inspect_repo(REPO).complete
    # Once downloaded for real it is complete and verified.
    dl.download(REPO, settings=FAST)
    assert dl.inspect_repo(REPO).ready and REPO in dl.downloaded_repos()


def test_a_stored_listing_without_safetensors_is_never_complete(hub_server):
    files = {"config.json": b'{"model_type": "qwen3_5"}', "tokenizer.json": b"{}"}
    served = hub_server.add_repo(REPO, files)
    rdir = hfcache.repo_dir(REPO)
    hfcache.ensure_repo_dirs(rdir)
    listing = [RemoteFile(p, f.size, f.blob_id, f.sha256) for p, f in served.files.items()]
    hfcache.write_listing(rdir, served.commit, listing)
    hfcache.write_ref(rdir, "main", served.commit)
    for f in listing:
        hfcache.blob_path(rdir, f.etag).write_bytes(served.files[f.path].data)
        hfcache.link_snapshot(rdir, served.commit, f.path, f.etag)
    local = dl.inspect_repo(REPO)
    assert local.bytes_total == sum(f.size for f in listing)  # every listed file is here at its size...
    assert not local.complete and REPO not in dl.downloaded_repos()  # ...but there are no weights
    with pytest.raises(dl.DownloadError) as err:
        dl.plan_download(REPO)
    assert err.value.kind == "not_found" and "weight" in str(err.value)


def test_a_sharded_snapshot_missing_a_shard_the_index_names_is_not_complete(hub_server, repo, monkeypatch):
    import shutil

    from huggingface_hub import snapshot_download

    snapshot_download(REPO, endpoint=hub_server.url, cache_dir=dl.hub_cache_dir(), allow_patterns=dl.NEEDED_PATTERNS)
    rdir = hfcache.repo_dir(REPO)
    shutil.rmtree(rdir / "trees")  # no stored listing: the index is all there is to go by
    assert dl.inspect_repo(REPO).complete and not dl.inspect_repo(REPO).verified
    (rdir / "snapshots" / repo.commit / SHARD2).unlink()
    assert not dl.inspect_repo(REPO).complete and REPO not in dl.downloaded_repos()
