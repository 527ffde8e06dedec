"""The download manager against the hub stand-in: real huggingface_hub client, real HTTP, real files, faults on demand."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from macapp.core import download as dl
from macapp.core.download import hfcache
from tests.fixtures.hub import random_repo_files

REPO = "mlx-community/Tiny-Test-4bit"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
NEEDED = {SHARD1, SHARD2, "model.safetensors.index.json", "config.json", "tokenizer.json", "tokenizer_config.json"}
FAST = dl.DownloadSettings(attempts=3, backoff_s=0.05, stall_report_s=0.3, stall_timeout_s=1.0,
                           progress_interval_s=0.05, connect_timeout_s=2.0, disk_margin=0)


@pytest.fixture
def repo(hub_server):
    return hub_server.add_repo(REPO, random_repo_files())


def _needed_bytes(repo) -> int:
    return sum(f.size for p, f in repo.files.items() if p in NEEDED)


def _blob(repo, path: str) -> Path:
    f = repo.files[path]
    return hfcache.blob_path(hfcache.repo_dir(REPO), f.etag)


def _partial(repo, path: str) -> Path:
    return hfcache.partial_path(hfcache.repo_dir(REPO), repo.files[path].etag)


def _wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


# --- plan ------------------------------------------------------------------------------------------------------------
def test_plan_gives_exact_sizes_and_hashes_of_only_the_needed_files_and_fetches_nothing(hub_server, repo):
    plan = dl.plan_download(REPO)
    assert {f.remote.path for f in plan.files} == NEEDED  # no README, .gitattributes or original/*.pth
    assert plan.bytes_total == _needed_bytes(repo)
    for f in plan.files:
        served = repo.files[f.remote.path]
        assert f.remote.size == served.size and f.state == "missing"
        if f.remote.is_weight:
            assert f.remote.sha256 == hashlib.sha256(served.data).hexdigest()
    assert plan.commit == repo.commit and plan.disk_ok and plan.disk_free > plan.bytes_total
    assert hub_server.bytes_served() == 0 and not hub_server.file_requests(method="HEAD")


def test_plan_with_a_catalog_model_carries_the_fit_verdict(hub_server):
    from macapp.core.catalog import resolve_model

    model = resolve_model("Qwen3.5-0.8B", 4)
    hub_server.add_repo(model.repo, random_repo_files())
    plan = dl.plan_download(model.repo, model=model, context=4096)
    assert plan.fit is not None, plan.fit_note
    assert plan.fit.verdict in ("fits", "tight", "too_big") and plan.fit.context == 4096
    assert plan.fit.weights_bytes == plan.weights_bytes  # the exact listing, not the catalog's guess


def test_without_a_context_the_fit_is_judged_at_the_apps_one_default_context(hub_server):
    from macapp.core import sizing
    from macapp.core.catalog import resolve_model

    model = resolve_model("Qwen3.5-0.8B", 4)
    hub_server.add_repo(model.repo, random_repo_files())
    plan = dl.plan_download(model.repo, model=model)
    assert plan.fit is not None, plan.fit_note
    assert plan.fit.context == sizing.DEFAULT_CONTEXT  # what `qwen-desk fit` and the window use


# --- the happy path and the shared cache -----------------------------------------------------------------------------
def test_download_lands_in_the_hf_cache_layout_verified_and_a_second_run_fetches_nothing(hub_server, repo):
    events: list = []
    result = dl.download(REPO, on_event=events.append, settings=FAST)
    assert result.verified and result.bytes_total == result.bytes_downloaded_this_run == _needed_bytes(repo)
    assert set(result.files) == NEEDED
    rdir = hfcache.repo_dir(REPO)
    assert (rdir / "refs" / "main").read_text() == repo.commit
    assert result.path == rdir / "snapshots" / repo.commit
    for path in NEEDED:
        entry = result.path / path
        assert entry.is_symlink() and entry.resolve() == _blob(repo, path).resolve()
        assert entry.read_bytes() == repo.files[path].data
    assert not list((rdir / "blobs").glob("*.incomplete"))
    # huggingface_hub sees a normal cache entry.
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    info = {r.repo_id: r for r in scan_cache_dir(dl.hub_cache_dir()).repos}
    assert info[REPO].size_on_disk == _needed_bytes(repo)
    assert try_to_load_from_cache(REPO, "config.json", cache_dir=dl.hub_cache_dir()) == str(result.path / "config.json")
    # Events: a plan first, progress that ends complete, the result last.
    assert isinstance(events[0], dl.Planned) and isinstance(events[-1], dl.Finished)
    progress = [e for e in events if isinstance(e, dl.Progress)]
    assert progress[-1].bytes_done == progress[-1].bytes_total and {f.state for f in progress[-1].files} == {"ready"}
    assert dl.is_ready(REPO)
    [local] = dl.list_downloaded()
    assert local.repo == REPO and local.ready and local.bytes_total == _needed_bytes(repo)
    assert REPO in dl.downloaded_repos()

    served = hub_server.bytes_served()
    again = dl.download(REPO, settings=FAST)
    assert again.bytes_downloaded_this_run == 0 and hub_server.bytes_served() == served


def test_a_model_placed_by_snapshot_download_is_recognised_and_not_fetched_again(hub_server, repo):
    from huggingface_hub import snapshot_download

    snapshot_download(REPO, endpoint=hub_server.url, cache_dir=dl.hub_cache_dir(), allow_patterns=dl.NEEDED_PATTERNS)
    served = hub_server.bytes_served()
    assert served == _needed_bytes(repo)
    plan = dl.plan_download(REPO)
    assert {f.state for f in plan.files} == {"present"} and plan.bytes_to_fetch == 0  # complete, hashes not yet checked
    assert not dl.is_ready(REPO)
    result = dl.download(plan, settings=FAST)
    assert result.bytes_downloaded_this_run == 0 and hub_server.bytes_served() == served
    assert dl.is_ready(REPO)


def test_mlx_lms_own_fetch_after_ours_downloads_nothing(hub_server, repo):
    """mlx_lm.load(repo) online calls snapshot_download with its allow patterns: our files must satisfy it."""
    from huggingface_hub import snapshot_download

    dl.download(REPO, settings=FAST)
    served = hub_server.bytes_served()
    path = snapshot_download(REPO, endpoint=hub_server.url, cache_dir=dl.hub_cache_dir(),
                             allow_patterns=dl.NEEDED_PATTERNS)
    assert Path(path) == hfcache.snapshot_dir(hfcache.repo_dir(REPO), repo.commit)
    assert hub_server.bytes_served() == served


def test_a_model_we_fetched_loads_with_mlx_lm_by_repo_id_offline(hub_server, tiny_dense_4bit_path):
    hub_server.add_repo(REPO, tiny_dense_4bit_path)
    result = dl.download(REPO, settings=FAST)
    code = ("import mlx_lm, json; model, tok = mlx_lm.load(%r); "
            "print(json.dumps({'type': model.model_type, 'ids': tok.encode('hello')}))" % REPO)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")  # no network at all
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["type"] == json.loads((result.path / "config.json").read_text())["model_type"]
    assert loaded["ids"]


# --- faults ----------------------------------------------------------------------------------------------------------
def test_a_dropped_connection_is_resumed_with_a_range_request(hub_server, repo):
    hub_server.cut(SHARD1, after=700_000)
    events: list = []
    dl.download(REPO, on_event=events.append, settings=FAST)
    gets = hub_server.file_requests(SHARD1)
    assert [g.range for g in gets] == [None, "bytes=700000-"]
    assert hub_server.bytes_served(SHARD1) == repo.files[SHARD1].size  # not one byte twice
    assert any(isinstance(e, dl.Retrying) and e.path == SHARD1 for e in events)
    assert _blob(repo, SHARD1).read_bytes() == repo.files[SHARD1].data


def test_a_server_that_ignores_range_restarts_the_file_and_progress_never_passes_100_percent(hub_server, repo):
    size = repo.files[SHARD1].size
    hub_server.cut(SHARD1, after=700_000)
    hub_server.ignore_range(SHARD1)  # the resume request gets 200 and the whole file
    hub_server.stall(SHARD1, after=size - 100_000, seconds=0.5, times=2)  # hold the restarted transfer near its end
    events: list = []
    result = dl.download(REPO, on_event=events.append, settings=FAST)
    gets = hub_server.file_requests(SHARD1)
    assert [(g.range, g.status) for g in gets] == [(None, 200), ("bytes=700000-", 200)]
    progress = [e for e in events if isinstance(e, dl.Progress)]
    shard = [f for p in progress for f in p.files if f.path == SHARD1]
    assert any(f.done == size - 100_000 for f in shard)  # seen mid-restart: counted from 0, not from 700 000
    assert all(f.done <= f.size for f in shard)
    assert all(p.bytes_done <= p.bytes_total for p in progress)
    assert result.verified and _blob(repo, SHARD1).read_bytes() == repo.files[SHARD1].data


def test_a_corrupted_byte_is_caught_and_only_that_file_is_fetched_again(hub_server, repo):
    hub_server.corrupt(SHARD2, offset=123_456)
    events: list = []
    result = dl.download(REPO, on_event=events.append, settings=FAST)
    assert result.refetched == (SHARD2,)
    assert hub_server.bytes_served(SHARD2) == 2 * repo.files[SHARD2].size
    assert hub_server.bytes_served(SHARD1) == repo.files[SHARD1].size
    assert any(isinstance(e, dl.Notice) and SHARD2 in e.message and "hash" in e.message for e in events)
    assert _blob(repo, SHARD2).read_bytes() == repo.files[SHARD2].data


def test_a_server_that_keeps_sending_corrupt_bytes_never_yields_a_ready_model(hub_server, repo):
    hub_server.corrupt(SHARD2, offset=10, times=10)
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    assert err.value.kind == "integrity" and SHARD2 in str(err.value)
    assert not _blob(repo, SHARD2).exists() and not _partial(repo, SHARD2).exists()
    assert not dl.is_ready(REPO)
    assert _blob(repo, SHARD1).exists()  # the good file is kept


def test_a_file_corrupted_on_disk_is_detected_and_refetched_alone(hub_server, repo):
    dl.download(REPO, settings=FAST)
    blob = _blob(repo, SHARD1)
    data = bytearray(blob.read_bytes())
    data[5] ^= 0xFF
    blob.write_bytes(bytes(data))
    assert not dl.is_ready(REPO)
    served = hub_server.bytes_served()
    result = dl.download(REPO, settings=FAST)
    assert result.refetched == (SHARD1,)
    assert hub_server.bytes_served() - served == repo.files[SHARD1].size
    assert blob.read_bytes() == repo.files[SHARD1].data and dl.is_ready(REPO)


def test_a_stall_is_reported_as_a_stall_then_the_transfer_is_resumed(hub_server, repo):
    hub_server.stall(SHARD1, after=400_000, seconds=4)
    events: list = []
    dl.download(REPO, on_event=events.append, settings=FAST)
    stalls = [e for e in events if isinstance(e, dl.Stalled)]
    assert stalls and stalls[0].seconds >= FAST.stall_report_s
    stalled_progress = [e for e in events if isinstance(e, dl.Progress) and e.stalled]
    assert stalled_progress and all(p.speed_bps == 0 and p.eta_s is None for p in stalled_progress)
    assert [g.range for g in hub_server.file_requests(SHARD1)] == [None, "bytes=400000-"]
    assert hub_server.bytes_served(SHARD1) == repo.files[SHARD1].size


@pytest.mark.parametrize("status", [500, 503, 429])
def test_transient_server_errors_are_retried_with_backoff(hub_server, repo, status):
    hub_server.fail(f"*/resolve/*/{SHARD1}", status=status, times=2)
    hub_server.fail("/api/models/*", status=status, times=1)
    events: list = []
    result = dl.download(REPO, on_event=events.append, settings=FAST)
    assert result.verified
    retries = [e for e in events if isinstance(e, dl.Retrying)]
    assert [r.path for r in retries] == ["(file listing)", SHARD1, SHARD1]
    assert retries[2].delay_s > retries[1].delay_s  # backoff grows


def test_server_errors_that_do_not_stop_end_with_a_clear_error_and_keep_the_rest(hub_server, repo):
    hub_server.fail(f"*/resolve/*/{SHARD1}", status=500, times=100)
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    e = err.value
    assert e.kind == "server" and SHARD1 in str(e) and "3 failed attempts" in str(e) and "resume" in str(e)
    assert _blob(repo, SHARD2).read_bytes() == repo.files[SHARD2].data
    hub_server.clear_faults()
    served = hub_server.bytes_served()
    dl.download(REPO, settings=FAST)
    assert hub_server.bytes_served() - served == repo.files[SHARD1].size


def test_a_hub_that_goes_away_mid_download_gives_a_network_error_and_keeps_the_bytes(hub_server, repo):
    hub_server.stall(SHARD1, after=300_000, seconds=30)
    _wait = threading.Thread(target=lambda: (_wait_for(lambda: _size(_partial(repo, SHARD1)) >= 300_000),
                                             hub_server.stop()))
    _wait.start()
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    _wait.join()
    assert err.value.kind == "network" and "resume" in str(err.value)
    assert _size(_partial(repo, SHARD1)) == 300_000 and err.value.bytes_kept >= 300_000


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


def test_a_size_that_disagrees_with_the_listing_is_an_integrity_error(hub_server):
    files = random_repo_files()
    repo = hub_server.add_repo(REPO, files, claimed_sizes={SHARD1: len(files[SHARD1]) + 10})
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    assert err.value.kind == "integrity" and SHARD1 in str(err.value)
    assert str(repo.files[SHARD1].size) in str(err.value)
    assert not dl.is_ready(REPO)


# --- offline ---------------------------------------------------------------------------------------------------------
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


# --- cancel, pause, resume, crash ------------------------------------------------------------------------------------
def _download_in_background(token, settings):
    """Run dl.download(REPO) on a thread; the returned dict gets its exception ("error") and end time ("ended")."""
    outcome: dict = {}

    def run():
        try:
            dl.download(REPO, cancel=token, settings=settings)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome["error"] = exc
        outcome["ended"] = time.monotonic()

    worker = threading.Thread(target=run)
    worker.start()
    return worker, outcome


def test_cancel_stops_within_a_second_and_resume_fetches_only_the_rest(hub_server, repo):
    hub_server.stall(SHARD1, after=500_000, seconds=30)
    token = dl.CancelToken()
    worker, outcome = _download_in_background(token, FAST)
    others = [p for p in NEEDED if p != SHARD1]
    _wait_for(lambda: _size(_partial(repo, SHARD1)) >= 500_000 and all(_blob(repo, p).exists() for p in others),
              what="mid-file")
    cancelled_at = time.monotonic()
    token.cancel()
    worker.join(timeout=10)
    assert isinstance(outcome.get("error"), dl.DownloadCancelled)
    assert outcome["ended"] - cancelled_at < 1.5  # about a second, generously
    assert _size(_partial(repo, SHARD1)) == 500_000  # pause keeps what is done
    hub_server.clear_faults()
    result = dl.download(REPO, settings=FAST)
    assert result.bytes_downloaded_this_run == repo.files[SHARD1].size - 500_000
    assert hub_server.file_requests(SHARD1)[-1].range == "bytes=500000-"
    assert hub_server.bytes_served() == _needed_bytes(repo)


def test_a_cancel_is_prompt_even_while_a_request_waits_for_headers_and_the_straggler_writes_nothing(hub_server, repo):
    # SHARD1's request waits for its headers (no socket to shut down yet): it cannot be woken.
    hub_server.hold(SHARD1, seconds=4.0)
    token = dl.CancelToken()
    worker, outcome = _download_in_background(token, dl.DownloadSettings(**{**FAST.__dict__, "stall_timeout_s": 15.0}))
    _wait_for(lambda: hub_server.file_requests(SHARD1), what="the held request")
    cancelled_at = time.monotonic()
    token.cancel()
    worker.join(timeout=20)
    assert isinstance(outcome.get("error"), dl.DownloadCancelled)
    assert outcome["ended"] - cancelled_at < 2.5  # about a second, not the held request's 4 s
    # The held answer arrives later; the straggler sees the cancel and leaves nothing behind.
    _wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("qwen-desk-download")],
              what="the straggler to end", timeout=15)
    assert not _blob(repo, SHARD1).exists()
    assert not _partial(repo, SHARD1).exists() or _size(_partial(repo, SHARD1)) == 0
    with hfcache.try_lock(hfcache.repo_lock_path(REPO)) as free:
        assert free
    hub_server.clear_faults()
    assert dl.download(REPO, settings=FAST).verified


def test_kill_9_mid_file_then_resume_fetches_only_the_missing_bytes(hub_server, repo):
    hub_server.stall(SHARD1, after=1_000_000, seconds=30)
    code = "from macapp.core.download import download; download(%r)" % REPO
    proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        others = [p for p in NEEDED if p != SHARD1]
        _wait_for(lambda: _size(_partial(repo, SHARD1)) == 1_000_000 and all(_blob(repo, p).exists() for p in others),
                  what="the subprocess to be mid-file")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    hub_server.clear_faults()
    result = dl.download(REPO, settings=FAST)
    assert hub_server.file_requests(SHARD1)[-1].range == "bytes=1000000-"
    assert result.bytes_downloaded_this_run == repo.files[SHARD1].size - 1_000_000
    assert hub_server.bytes_served() == _needed_bytes(repo)  # over both runs: every byte exactly once
    assert dl.is_ready(REPO)


def test_huggingface_hub_orphans_after_a_kill_are_adopted_or_cleaned(hub_server):
    # huggingface_hub writes in 10 MB chunks to <etag>.<8 hex>.incomplete; kill it mid-file and see what we do.
    files = random_repo_files(shards=2, shard_bytes=12_000_000, seed=3)
    repo = hub_server.add_repo(REPO, files)
    hub_server.stall(SHARD1, after=11_000_000, seconds=30)
    code = ("from huggingface_hub import hf_hub_download; hf_hub_download(%r, %r, endpoint=%r, cache_dir=%r)"
            % (REPO, SHARD1, hub_server.url, str(dl.hub_cache_dir())))
    proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    blobs = hfcache.repo_dir(REPO) / "blobs"
    etag = repo.files[SHARD1].etag
    try:
        _wait_for(lambda: any(p.stat().st_size >= 10_000_000 for p in blobs.glob(f"{etag}.*.incomplete")),
                  what="huggingface_hub's temp file")
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    [orphan] = list(blobs.glob(f"{etag}.*.incomplete"))
    kept = orphan.stat().st_size
    stray = blobs / f"{'0' * 64}.abcdef12.incomplete"  # an orphan of a blob nobody needs
    stray.write_bytes(b"x" * 100)
    hub_server.clear_faults()
    hub_server.reset_log()
    events: list = []
    dl.download(REPO, on_event=events.append, settings=FAST)
    assert hub_server.file_requests(SHARD1)[-1].range == f"bytes={kept}-"
    assert hub_server.bytes_served(SHARD1) == repo.files[SHARD1].size - kept
    assert not list(blobs.glob("*.incomplete"))
    notes = " ".join(e.message for e in events if isinstance(e, dl.Notice))
    assert "picked up" in notes and "removed 1" in notes


# --- disk space ------------------------------------------------------------------------------------------------------
def test_not_enough_disk_is_refused_before_any_byte_is_fetched(hub_server):
    files = random_repo_files()
    hub_server.add_repo(REPO, files, claimed_sizes={SHARD1: 50 * 1024**4})  # the listing says 50 TB
    plan = dl.plan_download(REPO)
    assert not plan.disk_ok and "disk space" in plan.disk_message()
    from macapp.core.memory import format_bytes

    # Decimal units like `qwen-desk fit` and the window: 50 TiB of claimed shard is "55.0 TB", not "51200.00 GB".
    assert f"{format_bytes(plan.bytes_to_fetch)} to fetch" in plan.disk_message()
    assert format_bytes(plan.bytes_to_fetch) == "55.0 TB"
    with pytest.raises(dl.DownloadError) as err:
        dl.download(plan, settings=FAST)
    assert err.value.kind == "disk_full" and "free" in str(err.value)
    assert "55.0 TB to fetch" in str(err.value)
    assert hub_server.bytes_served() == 0


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_a_disk_that_fills_up_during_the_download_keeps_the_data_and_resume_finishes(hub_server, repo, tmp_path,
                                                                                     monkeypatch):
    disk = tmp_path / "small-disk"
    if _mount_tmpfs(disk, "8m"):
        # A real ENOSPC: an 8 MB volume that something else fills up just as shard 2 starts to arrive.
        try:
            monkeypatch.setenv("HF_HOME", str(disk / "hf"))
            filler = disk / "filler"
            filled = []

            def fill(method, path):
                if method == "GET" and path.endswith(SHARD2) and not filled:
                    filled.append(path)
                    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
                    filler.write_bytes(b"\0" * (free - 1_000_000))

            hub_server.on_request = fill
            one_at_a_time = dl.DownloadSettings(**{**FAST.__dict__, "max_workers": 1})
            with pytest.raises(dl.DownloadError) as err:
                dl.download(REPO, settings=one_at_a_time)
            assert err.value.kind == "disk_full" and "disk filled up" in str(err.value) and "kept" in str(err.value)
            kept = _size(_partial(repo, SHARD2))
            assert 500_000 < kept < repo.files[SHARD2].size and _blob(repo, SHARD1).exists()
            filler.unlink()
            served = hub_server.bytes_served()
            result = dl.download(REPO, settings=FAST)
            assert hub_server.file_requests(SHARD2)[-1].range == f"bytes={kept}-"
            assert hub_server.bytes_served() - served == result.bytes_downloaded_this_run
            assert result.bytes_downloaded_this_run == _needed_bytes(repo) - repo.files[SHARD1].size - kept
            assert dl.is_ready(REPO)
        finally:
            hub_server.on_request = None
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    else:
        # Not allowed to mount: the OS's file-size limit (RLIMIT_FSIZE) refuses the write instead (EFBIG).
        code = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
                "resource.setrlimit(resource.RLIMIT_FSIZE, (2_000_000, 2_000_000)); "
                "from macapp.core.download import download, DownloadError\n"
                "try:\n    download(%r)\nexcept DownloadError as e:\n    print(e.kind, '|', e)" % REPO)
        out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True,
                             timeout=60)
        assert out.stdout.startswith("disk_full |") and "kept" in out.stdout, out.stdout + out.stderr[-1500:]
        kept = _size(_partial(repo, SHARD1))
        assert 1_500_000 < kept <= 2_000_000  # what was written and hashed before the refusal
        served = hub_server.bytes_served()
        result = dl.download(REPO, settings=FAST)
        assert hub_server.file_requests(SHARD1)[-1].range == f"bytes={kept}-"
        assert hub_server.bytes_served() - served == result.bytes_downloaded_this_run
        assert dl.is_ready(REPO)


# --- list and delete -------------------------------------------------------------------------------------------------
def test_list_shows_partial_downloads_and_delete_removes_everything(hub_server, repo):
    hub_server.cut(SHARD1, after=250_000)
    with pytest.raises(dl.DownloadError):  # one file at a time, no retry: stops after 250 kB of the first shard
        dl.download(REPO, settings=dl.DownloadSettings(**{**FAST.__dict__, "attempts": 1, "max_workers": 1}))
    [partial] = dl.list_downloaded()
    assert not partial.complete and partial.partial_bytes == 250_000 and REPO not in dl.downloaded_repos()
    assert partial.commit == repo.commit and partial.bytes_total == _needed_bytes(repo)
    hub_server.clear_faults()
    dl.download(REPO, settings=FAST)
    [full] = dl.list_downloaded()
    assert full.ready and full.partial_bytes == 0 and full.bytes_on_disk >= _needed_bytes(repo)
    assert dl.delete_model(REPO) >= _needed_bytes(repo)
    assert dl.list_downloaded() == [] and not hfcache.repo_dir(REPO).exists() and not dl.is_ready(REPO)


def test_a_second_download_of_the_same_repo_is_refused_while_one_runs(hub_server, repo):
    with hfcache.try_lock(hfcache.repo_lock_path(REPO)) as held:
        assert held
        with pytest.raises(dl.DownloadError) as err:
            dl.download(REPO, settings=FAST)
    assert err.value.kind == "busy"
    assert dl.download(REPO, settings=FAST).verified


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
    assert hub_server.bytes_served() == _needed_bytes(repo) and dl.is_ready(REPO)
    # huggingface_hub itself accepts the stand-in's redirect answers (its HEAD stops at the 302 to another host).
    from huggingface_hub import hf_hub_download

    other = dl.hub_cache_dir().parent / "other-cache"
    path = hf_hub_download(REPO, SHARD2, endpoint=hub_server.url, cache_dir=other, token=hub_server.token)
    assert Path(path).read_bytes() == repo.files[SHARD2].data
    assert Path(path).resolve().name == repo.files[SHARD2].sha256


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
    assert dl.is_ready(REPO)
    blob = _blob(repo, SHARD2)
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    assert err.value.kind == "offline" and SHARD2 in str(err.value) and hub_server.log == []


# --- what counts as downloaded ---------------------------------------------------------------------------------------
def test_a_cache_folder_holding_only_config_json_is_not_a_downloaded_model(hub_server, repo):
    from huggingface_hub import hf_hub_download

    # What a tool reading one config leaves behind: refs/main and a snapshot with config.json alone (no listing).
    hf_hub_download(REPO, "config.json", endpoint=hub_server.url, cache_dir=dl.hub_cache_dir())
    rdir = hfcache.repo_dir(REPO)
    assert (rdir / "snapshots" / repo.commit / "config.json").is_file() and not (rdir / "trees").exists()
    local = dl.inspect_repo(REPO)
    assert local is not None and not local.complete and not local.ready
    assert REPO not in dl.downloaded_repos() and not dl.is_ready(REPO)
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
    listing = [hfcache.RemoteFile(p, f.size, f.blob_id, f.sha256) for p, f in served.files.items()]
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
