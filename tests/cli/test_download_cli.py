"""`qwen-desk download`: the JSON contract, progress output, resume, Ctrl-C, errors, --list/--delete/--dry-run."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

from macapp.cli import main
from macapp.cli.download import _ProgressView
from macapp.core import download as dl
from macapp.core.download import hfcache
from tests.fixtures.downloads import is_ready
from tests.fixtures.hub import random_repo_files

MODEL = "Qwen3.5-0.8B"  # a catalog name: resolves to REPO without the network
REPO = "mlx-community/Qwen3.5-0.8B-4bit"
SHARD1 = "model-00001-of-00002.safetensors"
CONTRACT = {"repo", "path", "bytes_total", "bytes_downloaded_this_run", "files", "verified"}


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _needed(repo) -> int:
    return sum(f.size for p, f in repo.files.items() if p.endswith((".safetensors", ".json")))


def test_json_contract_then_a_second_run_fetches_nothing(hub_server, capsys):
    repo = hub_server.add_repo(REPO, random_repo_files())
    code, out, err = run_cli(capsys, "download", MODEL, "--bits", "4", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert CONTRACT <= set(data)
    assert data["repo"] == REPO and data["verified"] is True
    assert data["bytes_total"] == data["bytes_downloaded_this_run"] == _needed(repo)
    assert sorted(data["files"]) == sorted(p for p in repo.files if p.endswith((".safetensors", ".json")))
    assert (hfcache.snapshot_dir(hfcache.repo_dir(REPO), repo.commit) / "config.json").is_file()
    assert data["path"] == str(hfcache.snapshot_dir(hfcache.repo_dir(REPO), repo.commit))
    assert "ready:" in err and "hashes checked" in err
    from macapp.core.memory import format_bytes

    assert f"ready: {REPO} ({format_bytes(data['bytes_total'])}," in err  # decimal units: 1 MB = 1e6 bytes
    code, out, _ = run_cli(capsys, "download", MODEL, "--json")
    assert code == 0 and json.loads(out)["bytes_downloaded_this_run"] == 0


def test_plain_progress_lines_when_stderr_is_not_a_terminal(hub_server):
    hub_server.add_repo(REPO, random_repo_files())
    out = subprocess.run([sys.executable, "-m", "macapp", "download", MODEL], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""  # everything human goes to stderr
    assert "\r" not in out.stderr and "\x1b[" not in out.stderr
    assert f"ready: {SHARD1}" in out.stderr and "100%" in out.stderr and f"ready: {REPO}" in out.stderr


def test_a_progress_bar_redrawn_in_place_on_a_terminal(hub_server):
    hub_server.add_repo(REPO, random_repo_files())
    hub_server.stall(SHARD1, after=500_000, seconds=1.5)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    view = _ProgressView(screen)
    dl.download(REPO, on_event=view.on_event, settings=dl.DownloadSettings(stall_report_s=0.3, progress_interval_s=0.05))
    view.close()
    text = screen.getvalue()
    assert "\r[" in text and "\x1b[K" in text and "#" * 24 in text  # a full bar at the end
    assert "stalled" in text  # the stall shows as a stall, not as a frozen speed


def test_ctrl_c_stops_cleanly_says_how_to_resume_and_the_next_run_resumes(hub_server):
    repo = hub_server.add_repo(REPO, random_repo_files())
    hub_server.stall(SHARD1, after=800_000, seconds=30)
    proc = subprocess.Popen(
        [sys.executable, "-m", "macapp", "download", MODEL], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=dict(os.environ)
    )
    partial = hfcache.partial_path(hfcache.repo_dir(REPO), repo.files[SHARD1].etag)
    others = [hfcache.blob_path(hfcache.repo_dir(REPO), f.etag) for p, f in repo.files.items() if p != SHARD1 and p.endswith((".safetensors", ".json"))]

    def mid_file() -> bool:
        return partial.exists() and partial.stat().st_size == 800_000 and all(b.exists() for b in others)

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not mid_file():
        time.sleep(0.02)
    assert mid_file()
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=20)[1]
    assert proc.returncode == 130, err
    assert f"Run `qwen-desk download {MODEL}` again to resume" in err and "Traceback" not in err
    assert partial.stat().st_size == 800_000
    hub_server.clear_faults()
    again = subprocess.run([sys.executable, "-m", "macapp", "download", MODEL, "--json"], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert again.returncode == 0, again.stderr
    data = json.loads(again.stdout)
    assert hub_server.file_requests(SHARD1)[-1].range == "bytes=800000-"
    assert data["bytes_downloaded_this_run"] == repo.files[SHARD1].size - 800_000
    assert hub_server.bytes_served() == _needed(repo)  # across both runs, nothing fetched twice


def test_a_gated_model_exits_1_asking_for_a_token(hub_server, capsys, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hub_server.add_repo(REPO, random_repo_files(), gated=True)
    code, out, err = run_cli(capsys, "download", MODEL, "--json")
    assert code == 1
    assert "HF_TOKEN" in err and "hf auth login" in err
    data = json.loads(out)
    assert data["error"]["kind"] == "gated" and data["ready"] is False


def test_unknown_model_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys, "download", "Qwen9-Nonsense")
    assert code == 2 and "unknown model" in err
    code, _, err = run_cli(capsys, "download")
    assert code == 2 and "--list" in err


def test_dry_run_shows_the_plan_and_fetches_nothing(hub_server, capsys):
    repo = hub_server.add_repo(REPO, random_repo_files())
    code, out, err = run_cli(capsys, "download", MODEL, "--dry-run", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["bytes_total"] == plan["bytes_to_fetch"] == _needed(repo) and plan["disk_ok"] is True
    assert plan["fit"] in ("fits", "tight", "too_big")
    assert "to fetch" in err and "on this machine" in err
    assert hub_server.bytes_served() == 0


def test_list_and_delete(hub_server, capsys):
    hub_server.add_repo(REPO, random_repo_files())
    code, out, _ = run_cli(capsys, "download", "--list")
    assert code == 0 and "no models" in out
    assert run_cli(capsys, "download", MODEL)[0] == 0
    code, out, _ = run_cli(capsys, "download", "--list", "--json")
    [row] = json.loads(out)
    assert row["repo"] == REPO and row["verified"] and row["complete"] and row["bytes_on_disk"] > 0
    code, out, _ = run_cli(capsys, "download", "--list")
    assert REPO in out and "ready" in out
    from macapp.core.memory import format_bytes

    assert format_bytes(row["bytes_on_disk"]) in out and " MB " in out  # decimal units, like `qwen-desk fit`
    code, out, _ = run_cli(capsys, "download", MODEL, "--delete")
    assert code == 0 and "deleted" in out
    assert not hfcache.repo_dir(REPO).exists() and dl.list_downloaded() == []


def test_a_model_fetched_by_another_tool_is_listed_as_not_yet_verified_and_download_verifies_it(hub_server, capsys):
    from huggingface_hub import snapshot_download

    repo = hub_server.add_repo(REPO, random_repo_files())
    snapshot_download(REPO, endpoint=hub_server.url, cache_dir=dl.hub_cache_dir(), allow_patterns=dl.NEEDED_PATTERNS)
    served = hub_server.bytes_served()
    assert REPO in dl.downloaded_repos() and not dl.downloaded_repos()[REPO].verified  # usable, listed, unchecked
    code, out, _ = run_cli(capsys, "download", "--list")
    assert code == 0 and "not yet verified" in out and f"qwen-desk download {REPO}" in out
    code, out, err = run_cli(capsys, "download", REPO, "--json")  # the command the listing names
    assert code == 0, err
    assert "not yet verified" in err and "nothing is fetched" in err
    data = json.loads(out)
    assert data["verified"] is True and data["bytes_downloaded_this_run"] == 0
    assert hub_server.bytes_served() == served == _needed(repo)  # hashes checked, not one byte fetched again
    code, out, _ = run_cli(capsys, "download", "--list")
    assert "not yet verified" not in out and "ready" in out and is_ready(REPO)
