"""Running downloads against the hub stand-in: real huggingface_hub client, real HTTP, real files, faults on demand."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from macapp.core import download as dl
from macapp.core.download import hfcache
from tests.fixtures.downloads import (
    FAST,
    NEEDED,
    REPO,
    SHARD1,
    SHARD2,
    blob_of,
    download_in_background,
    is_ready,
    needed_bytes,
    partial_of,
    size_of,
    wait_for,
)
from tests.fixtures.hub import random_repo_files


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True).returncode == 0


def test_download_lands_in_the_hf_cache_layout_verified_and_a_second_run_fetches_nothing(hub_server, repo):
    events: list = []
    result = dl.download(REPO, on_event=events.append, settings=FAST)
    assert result.verified and result.bytes_total == result.bytes_downloaded_this_run == needed_bytes(repo)
    assert set(result.files) == NEEDED
    rdir = hfcache.repo_dir(REPO)
    assert (rdir / "refs" / "main").read_text() == repo.commit
    assert result.path == rdir / "snapshots" / repo.commit
    for path in NEEDED:
        entry = result.path / path
        assert entry.is_symlink() and entry.resolve() == blob_of(repo, path).resolve()
        assert entry.read_bytes() == repo.files[path].data
    assert not list((rdir / "blobs").glob("*.incomplete"))
    # huggingface_hub sees a normal cache entry.
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    info = {r.repo_id: r for r in scan_cache_dir(dl.hub_cache_dir()).repos}
    assert info[REPO].size_on_disk == needed_bytes(repo)
    assert try_to_load_from_cache(REPO, "config.json", cache_dir=dl.hub_cache_dir()) == str(result.path / "config.json")
    # Events: a plan first, progress that ends complete, the result last.
    assert isinstance(events[0], dl.Planned) and isinstance(events[-1], dl.DownloadFinished)
    progress = [e for e in events if isinstance(e, dl.Progress)]
    assert progress[-1].bytes_done == progress[-1].bytes_total and {f.state for f in progress[-1].files} == {"ready"}
    assert is_ready(REPO)
    [local] = dl.list_downloaded()
    assert local.repo == REPO and local.ready and local.bytes_total == needed_bytes(repo)
    assert REPO in dl.downloaded_repos()

    served = hub_server.bytes_served()
    again = dl.download(REPO, settings=FAST)
    assert again.bytes_downloaded_this_run == 0 and hub_server.bytes_served() == served


def test_a_model_placed_by_snapshot_download_is_recognised_and_not_fetched_again(hub_server, repo):
    from huggingface_hub import snapshot_download

    snapshot_download(REPO, endpoint=hub_server.url, cache_dir=dl.hub_cache_dir(), allow_patterns=dl.NEEDED_PATTERNS)
    served = hub_server.bytes_served()
    assert served == needed_bytes(repo)
    plan = dl.plan_download(REPO)
    assert {f.state for f in plan.files} == {"present"} and plan.bytes_to_fetch == 0  # complete, hashes not yet checked
    assert not is_ready(REPO)
    result = dl.download(plan, settings=FAST)
    assert result.bytes_downloaded_this_run == 0 and hub_server.bytes_served() == served
    assert is_ready(REPO)


def test_mlx_lms_own_fetch_after_ours_downloads_nothing(hub_server, repo):
    """mlx_lm.load(repo) online calls snapshot_download with its allow patterns: our files must satisfy it."""
    from huggingface_hub import snapshot_download

    dl.download(REPO, settings=FAST)
    served = hub_server.bytes_served()
    path = snapshot_download(REPO, endpoint=hub_server.url, cache_dir=dl.hub_cache_dir(), allow_patterns=dl.NEEDED_PATTERNS)
    assert Path(path) == hfcache.snapshot_dir(hfcache.repo_dir(REPO), repo.commit)
    assert hub_server.bytes_served() == served


def test_a_model_we_fetched_loads_with_mlx_lm_by_repo_id_offline(hub_server, tiny_dense_4bit_path):
    hub_server.add_repo(REPO, tiny_dense_4bit_path)
    result = dl.download(REPO, settings=FAST)
    code = "import mlx_lm, json; model, tok = mlx_lm.load(%r); print(json.dumps({'type': model.model_type, 'ids': tok.encode('hello')}))" % REPO
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")  # no network at all
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["type"] == json.loads((result.path / "config.json").read_text())["model_type"]
    assert loaded["ids"]


def test_a_dropped_connection_is_resumed_with_a_range_request(hub_server, repo):
    hub_server.cut(SHARD1, after=700_000)
    events: list = []
    dl.download(REPO, on_event=events.append, settings=FAST)
    gets = hub_server.file_requests(SHARD1)
    assert [g.range for g in gets] == [None, "bytes=700000-"]
    assert hub_server.bytes_served(SHARD1) == repo.files[SHARD1].size  # not one byte twice
    assert any(isinstance(e, dl.Retrying) and e.path == SHARD1 for e in events)
    assert blob_of(repo, SHARD1).read_bytes() == repo.files[SHARD1].data


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
    assert result.verified and blob_of(repo, SHARD1).read_bytes() == repo.files[SHARD1].data


def test_a_corrupted_byte_is_caught_and_only_that_file_is_fetched_again(hub_server, repo):
    hub_server.corrupt(SHARD2, offset=123_456)
    events: list = []
    result = dl.download(REPO, on_event=events.append, settings=FAST)
    assert result.refetched == (SHARD2,)
    assert hub_server.bytes_served(SHARD2) == 2 * repo.files[SHARD2].size
    assert hub_server.bytes_served(SHARD1) == repo.files[SHARD1].size
    assert any(isinstance(e, dl.Notice) and SHARD2 in e.message and "hash" in e.message for e in events)
    assert blob_of(repo, SHARD2).read_bytes() == repo.files[SHARD2].data


def test_a_server_that_keeps_sending_corrupt_bytes_never_yields_a_ready_model(hub_server, repo):
    hub_server.corrupt(SHARD2, offset=10, times=10)
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    assert err.value.kind == "integrity" and SHARD2 in str(err.value)
    assert not blob_of(repo, SHARD2).exists() and not partial_of(repo, SHARD2).exists()
    assert not is_ready(REPO)
    assert blob_of(repo, SHARD1).exists()  # the good file is kept


def test_a_file_that_keeps_failing_its_check_fails_alone_and_the_others_are_fetched_whole(hub_server, repo):
    hub_server.hold(SHARD1, seconds=0.6)  # the good shard's answer comes after the bad one has failed twice
    hub_server.corrupt(SHARD2, offset=10, times=2)  # twice: the most one download takes before it gives up
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    assert err.value.kind == "integrity" and SHARD2 in str(err.value)
    assert blob_of(repo, SHARD1).read_bytes() == repo.files[SHARD1].data  # fetched to the end, not stopped
    assert not partial_of(repo, SHARD1).exists() and not blob_of(repo, SHARD2).exists()
    again = dl.download(REPO, settings=FAST)  # the server mended: only the bad file is fetched
    assert again.verified and hub_server.bytes_served(SHARD1) == repo.files[SHARD1].size


def test_a_file_corrupted_on_disk_is_detected_and_refetched_alone(hub_server, repo):
    dl.download(REPO, settings=FAST)
    blob = blob_of(repo, SHARD1)
    data = bytearray(blob.read_bytes())
    data[5] ^= 0xFF
    blob.write_bytes(bytes(data))
    assert not is_ready(REPO)
    served = hub_server.bytes_served()
    result = dl.download(REPO, settings=FAST)
    assert result.refetched == (SHARD1,)
    assert hub_server.bytes_served() - served == repo.files[SHARD1].size
    assert blob.read_bytes() == repo.files[SHARD1].data and is_ready(REPO)


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
    assert blob_of(repo, SHARD2).read_bytes() == repo.files[SHARD2].data
    hub_server.clear_faults()
    served = hub_server.bytes_served()
    dl.download(REPO, settings=FAST)
    assert hub_server.bytes_served() - served == repo.files[SHARD1].size


def test_a_hub_that_goes_away_mid_download_gives_a_network_error_and_keeps_the_bytes(hub_server, repo):
    hub_server.stall(SHARD1, after=300_000, seconds=30)
    _wait = threading.Thread(target=lambda: (wait_for(lambda: size_of(partial_of(repo, SHARD1)) >= 300_000), hub_server.stop()))
    _wait.start()
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    _wait.join()
    assert err.value.kind == "network" and "resume" in str(err.value)
    assert size_of(partial_of(repo, SHARD1)) == 300_000 and err.value.bytes_kept >= 300_000


def test_a_size_that_disagrees_with_the_listing_is_an_integrity_error(hub_server):
    files = random_repo_files()
    repo = hub_server.add_repo(REPO, files, claimed_sizes={SHARD1: len(files[SHARD1]) + 10})
    with pytest.raises(dl.DownloadError) as err:
        dl.download(REPO, settings=FAST)
    assert err.value.kind == "integrity" and SHARD1 in str(err.value)
    assert str(repo.files[SHARD1].size) in str(err.value)
    assert not is_ready(REPO)


def test_cancel_stops_the_download_mid_stall_and_resume_fetches_only_the_rest(hub_server, repo):
    stall = hub_server.stall(SHARD1, after=500_000, seconds=120)
    token = dl.CancelToken()
    worker, outcome = download_in_background(token, FAST)
    others = [p for p in NEEDED if p != SHARD1]
    mid_file = lambda: size_of(partial_of(repo, SHARD1)) >= 500_000 and all(blob_of(repo, p).exists() for p in others)  # noqa: E731
    wait_for(lambda: mid_file() and stall.pausing == 1, what="mid-file, the server stalling")
    token.cancel()
    worker.join(timeout=60)
    assert isinstance(outcome.get("error"), dl.DownloadCancelled)
    assert stall.pausing == 1  # it ended while the server still held the transfer: the cancel ended it, not the stall
    assert size_of(partial_of(repo, SHARD1)) == 500_000  # pause keeps what is done
    hub_server.clear_faults()
    result = dl.download(REPO, settings=FAST)
    assert result.bytes_downloaded_this_run == repo.files[SHARD1].size - 500_000
    assert hub_server.file_requests(SHARD1)[-1].range == "bytes=500000-"
    assert hub_server.bytes_served() == needed_bytes(repo)


def test_a_cancel_is_prompt_even_while_a_request_waits_for_headers_and_the_straggler_writes_nothing(hub_server, repo):
    # SHARD1's request waits for its headers (no socket to shut down yet): it cannot be woken.
    hold = hub_server.hold(SHARD1, seconds=120)
    token = dl.CancelToken()
    worker, outcome = download_in_background(token, dl.DownloadSettings(**{**FAST.__dict__, "stall_timeout_s": 150.0}))
    wait_for(lambda: hold.pausing == 1, what="the held request")
    token.cancel()
    worker.join(timeout=60)
    assert isinstance(outcome.get("error"), dl.DownloadCancelled)
    assert hold.pausing == 1  # it ended while its request still waited for headers: the cancel ended it, not the answer
    # The held answer arrives now; the straggler sees the cancel and leaves nothing behind.
    hold.release()
    wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("qwen-desk-download")], what="the straggler to end", timeout=60)
    assert not blob_of(repo, SHARD1).exists()
    assert not partial_of(repo, SHARD1).exists() or size_of(partial_of(repo, SHARD1)) == 0
    with hfcache.try_lock(hfcache.repo_lock_path(REPO)) as free:
        assert free
    hub_server.clear_faults()
    assert dl.download(REPO, settings=FAST).verified


def test_kill_9_mid_file_then_resume_fetches_only_the_missing_bytes(hub_server, repo):
    hub_server.stall(SHARD1, after=1_000_000, seconds=30)
    code = "from macapp.core.download import download; download(%r)" % REPO
    proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        others = [p for p in NEEDED if p != SHARD1]
        wait_for(
            lambda: size_of(partial_of(repo, SHARD1)) == 1_000_000 and all(blob_of(repo, p).exists() for p in others), what="the subprocess to be mid-file"
        )
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
    assert hub_server.bytes_served() == needed_bytes(repo)  # over both runs: every byte exactly once
    assert is_ready(REPO)


def test_huggingface_hub_orphans_after_a_kill_are_adopted_or_cleaned(hub_server):
    # huggingface_hub writes in 10 MB chunks to <etag>.<8 hex>.incomplete; kill it mid-file and see what we do.
    files = random_repo_files(shards=2, shard_bytes=12_000_000, seed=3)
    repo = hub_server.add_repo(REPO, files)
    hub_server.stall(SHARD1, after=11_000_000, seconds=30)
    code = "from huggingface_hub import hf_hub_download; hf_hub_download(%r, %r, endpoint=%r, cache_dir=%r)" % (
        REPO,
        SHARD1,
        hub_server.url,
        str(dl.hub_cache_dir()),
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    blobs = hfcache.repo_dir(REPO) / "blobs"
    etag = repo.files[SHARD1].etag
    try:
        wait_for(lambda: any(p.stat().st_size >= 10_000_000 for p in blobs.glob(f"{etag}.*.incomplete")), what="huggingface_hub's temp file")
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


def test_a_disk_that_fills_up_during_the_download_keeps_the_data_and_resume_finishes(hub_server, repo, tmp_path, monkeypatch):
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
            kept = size_of(partial_of(repo, SHARD2))
            assert 500_000 < kept < repo.files[SHARD2].size and blob_of(repo, SHARD1).exists()
            filler.unlink()
            before = len(hub_server.file_requests())  # the resume's requests only: the refused one may still be sending
            result = dl.download(REPO, settings=FAST)
            assert hub_server.file_requests(SHARD2)[-1].range == f"bytes={kept}-"
            assert sum(r.body_bytes for r in hub_server.file_requests()[before:]) == result.bytes_downloaded_this_run
            assert result.bytes_downloaded_this_run == needed_bytes(repo) - repo.files[SHARD1].size - kept
            assert is_ready(REPO)
        finally:
            hub_server.on_request = None
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    else:
        # Not allowed to mount: the OS's file-size limit (RLIMIT_FSIZE) refuses the write instead (EFBIG).
        code = (
            "import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (2_000_000, 2_000_000)); "
            "from macapp.core.download import download, DownloadError\n"
            "try:\n    download(%r)\nexcept DownloadError as e:\n    print(e.kind, '|', e)" % REPO
        )
        out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True, timeout=60)
        assert out.stdout.startswith("disk_full |") and "kept" in out.stdout, out.stdout + out.stderr[-1500:]
        kept = size_of(partial_of(repo, SHARD1))
        assert 1_500_000 < kept <= 2_000_000  # what was written and hashed before the refusal
        served = hub_server.bytes_served()
        result = dl.download(REPO, settings=FAST)
        assert hub_server.file_requests(SHARD1)[-1].range == f"bytes={kept}-"
        assert hub_server.bytes_served() - served == result.bytes_downloaded_this_run
        assert is_ready(REPO)


def test_a_second_download_of_the_same_repo_is_refused_while_one_runs(hub_server, repo):
    with hfcache.try_lock(hfcache.repo_lock_path(REPO)) as held:
        assert held
        with pytest.raises(dl.DownloadError) as err:
            dl.download(REPO, settings=FAST)
    assert err.value.kind == "busy"
    assert dl.download(REPO, settings=FAST).verified
