"""`qwen-desk download <repo> --mtp` and the fit's MTP fields, against the hub stand-in."""

from __future__ import annotations

import json

from macapp.cli import main
from tests.fixtures.mtp import BUILD, ORIGINAL, mtp_repos, served  # noqa: F401


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_download_with_mtp_fetches_the_head_and_a_second_run_fetches_nothing(served, mtp_repos, capsys):
    code, out, err = run_cli(capsys, "download", BUILD, "--mtp", "--json")
    assert code == 0, err
    data = json.loads(out)
    head = sum(v.nbytes for v in mtp_repos.head.values())
    assert data["ready"] and data["mtp"]["ready"] and data["mtp"]["source_repo"] == ORIGINAL
    assert data["mtp"]["bytes_fetched_this_run"] == head == data["mtp"]["bytes_total"]
    assert f"from {ORIGINAL}" in err and "MTP head ready" in err
    code, out, err = run_cli(capsys, "download", BUILD, "--mtp", "--json")
    assert code == 0 and json.loads(out)["mtp"]["where"] == "fetched" and "nothing to fetch" in err


def test_the_fit_counts_the_head_and_says_where_it_comes_from(served, capsys):
    code, out, err = run_cli(capsys, "download", BUILD)
    assert code == 0, err
    code, out, _ = run_cli(capsys, "fit", BUILD, "--json")
    before = json.loads(out)
    assert before["mtp_where"] == "unknown" and not before["mtp_counted"]  # the original's headers never read
    code, out, err = run_cli(capsys, "download", BUILD, "--mtp", "--dry-run", "--json")
    assert code == 0, err
    planned = json.loads(out)["mtp"]
    assert planned["where"] == "to_fetch" and planned["source_repo"] == ORIGINAL and "to fetch from" in err
    code, out, _ = run_cli(capsys, "fit", BUILD, "--json")
    waiting = json.loads(out)
    assert waiting["mtp_where"] == "to_fetch" and waiting["mtp_fetch_bytes"] == planned["fetch_bytes"] > 0
    assert waiting["total_bytes"] == before["total_bytes"]  # not counted until it is on disk
    code, out, _ = run_cli(capsys, "fit", BUILD)
    assert "to fetch from" in out
    assert run_cli(capsys, "download", BUILD, "--mtp")[0] == 0
    code, out, _ = run_cli(capsys, "fit", BUILD, "--json")
    fetched = json.loads(out)
    assert fetched["mtp_where"] == "fetched" and fetched["mtp_counted"]
    assert fetched["total_bytes"] == before["total_bytes"] + fetched["mtp_bytes"]
    assert run_cli(capsys, "fit", BUILD)[1].count("fetched already") == 1


def test_errors_are_clear_and_exit_1(served, mtp_repos, capsys):
    code, out, err = run_cli(capsys, "download", BUILD, "--mtp", "--mtp-from", "nobody/missing", "--json")
    assert code == 1 and "MTP head" in err and "not found" in err
    assert json.loads(out)["mtp"]["error"]["kind"] == "not_found"
    served.add_repo("Qwen/No-Head", {k: v for k, v in mtp_repos.build_files.items() if k != "README.md"})
    code, out, err = run_cli(capsys, "download", BUILD, "--mtp", "--mtp-from", "Qwen/No-Head")
    assert code == 1 and "has no MTP head" in err


def test_kill_9_mid_fetch_keeps_what_arrived_and_the_next_run_fetches_only_the_rest(served, capsys):
    import os
    import signal
    import subprocess
    import sys
    import time

    from macapp.core.hub.mtp_fetch import plan_mtp_fetch

    code, _, err = run_cli(capsys, "download", BUILD)
    assert code == 0, err
    from macapp.core.download import inspect_repo

    folder = inspect_repo(BUILD).path
    plan = plan_mtp_fetch(folder, BUILD)
    shard = plan.ranges[-1].file
    first = next(i for i, r in enumerate(plan.ranges) if r.file == shard)  # the stall hits the shard's first range
    kept = sum(r.size for r in plan.ranges[:first])
    assert plan.ranges[first].size > 1000
    served.stall(shard, after=1000, seconds=30)
    served.reset_log()
    proc = subprocess.Popen(
        [sys.executable, "-m", "macapp", "download", BUILD, "--mtp"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )

    def mid_range() -> bool:
        return plan.part_path.exists() and plan.part_path.stat().st_size == kept + 1000

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not mid_range():
        time.sleep(0.02)
    assert mid_range()
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=20)
    assert not plan.side_file.exists() and plan.state_path.exists()
    served.clear_faults()
    sent_before = sum(r.body_bytes for r in served.file_requests("*.safetensors") if not r.range.startswith("bytes=0-"))
    code, out, err = run_cli(capsys, "download", BUILD, "--mtp", "--json")
    assert code == 0, err
    mtp = json.loads(out)["mtp"]
    assert mtp["resumed_bytes"] == kept + 1000 and mtp["bytes_fetched_this_run"] == plan.fetch_bytes - kept - 1000
    sent = sum(r.body_bytes for r in served.file_requests("*.safetensors") if not r.range.startswith("bytes=0-"))
    assert sent - sent_before == plan.fetch_bytes - kept - 1000  # nothing fetched twice
