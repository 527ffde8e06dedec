"""Fetching a build's missing MTP head from the original repo (macapp/core/hub/mtp_fetch.py), on the hub stand-in."""

from __future__ import annotations

import hashlib
import json

import mlx.core as mx
import pytest

from macapp.core.hub.errors import DownloadError, DownloadErrorKind
from macapp.core.hub.mtp import MtpWhere, folder_status
from macapp.core.hub.mtp_fetch import fetch_mtp_head, plan_mtp_fetch
from macapp.core.hub.mtp_quant import QuantRule
from macapp.core.modelfiles import mtp_side_file, read_safetensors_header
from tests.fixtures.mtp import BUILD, ORIGINAL


def _head_spans(mtp_repos) -> dict[str, list[tuple[int, int]]]:
    """file -> absolute (start, end) of each mtp tensor in the original's shards."""
    import tempfile
    from pathlib import Path

    spans: dict[str, list[tuple[int, int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in mtp_repos.original_files.items():
            if not name.endswith(".safetensors"):
                continue
            path = Path(tmp) / name
            path.write_bytes(data)
            header = read_safetensors_header(path)
            spans[name] = [(header.header_bytes + s, header.header_bytes + e) for k, (s, e) in header.tensors.items() if k.startswith("mtp.")]
    return spans


def _fetched_ranges(hub) -> list[tuple[str, int, int, int]]:
    out = []
    for r in hub.file_requests("*.safetensors"):
        assert r.range, f"a whole-file GET of {r.file}: only ranges may be asked for"
        start, end = r.range.removeprefix("bytes=").split("-")
        out.append((r.file, int(start), int(end) + 1, r.body_bytes))
    return out


def test_only_the_heads_byte_ranges_are_fetched_and_the_side_file_is_the_build_quantization(served, build_folder, mtp_repos):
    assert folder_status(build_folder, BUILD).where is MtpWhere.UNKNOWN  # the original was never read
    plan = plan_mtp_fetch(build_folder, BUILD)  # the card's base_model names the original
    assert plan.source_repo == ORIGINAL and len(plan.tensors) == len(mtp_repos.head)
    assert plan.fetch_bytes == sum(v.nbytes for v in mtp_repos.head.values())
    assert folder_status(build_folder, BUILD).where is MtpWhere.TO_FETCH  # the original's record is cached now
    served.reset_log()
    result = fetch_mtp_head(plan)
    spans = _head_spans(mtp_repos)
    ranges = _fetched_ranges(served)
    assert sum(body for *_, body in ranges) == plan.fetch_bytes == result.bytes_fetched_this_run
    for file, start, end, _ in ranges:  # every byte asked for belongs to an mtp tensor
        assert all(any(s <= pos < e for s, e in spans[file]) for pos in (start, end - 1))
    runs = sum(1 + sum(1 for (_, e), (s, _) in zip(sorted(v), sorted(v)[1:]) if e != s) for v in spans.values())
    assert len(ranges) == runs < len(plan.tensors)  # neighbouring tensors in one request, the others' bytes skipped

    side = mtp_side_file(build_folder)
    assert side == result.side_file and not side.is_relative_to(build_folder)
    rule = QuantRule(bits=4, group_size=64, dtype="F32")  # the build: 4-bit, group 64, float32 scales
    expected = rule.quantize(dict(mtp_repos.head))
    got = mx.load(str(side))
    assert set(got) == set(expected)
    assert "mtp.fc.scales" in got and "mtp.norm.scales" not in got  # Linear layers quantized, norms kept
    for name in expected:
        assert got[name].dtype == expected[name].dtype and mx.array_equal(got[name], expected[name]).item(), name
    meta = read_safetensors_header(side).metadata
    assert meta["qwen_desk.mtp.source_repo"] == ORIGINAL and meta["qwen_desk.mtp.source_revision"] == served.repos[ORIGINAL].commit
    assert meta["qwen_desk.mtp.bits"] == "4" and meta["qwen_desk.mtp.group_size"] == "64"
    etags = json.loads(meta["qwen_desk.mtp.source_etags"])
    assert etags == {f: hashlib.sha256(mtp_repos.original_files[f]).hexdigest() for f in spans}
    digests = json.loads(meta["qwen_desk.mtp.source_sha256"])
    assert digests["mtp.fc.weight"] == hashlib.sha256(bytes(memoryview(mtp_repos.head["mtp.fc.weight"]))).hexdigest()

    status = folder_status(build_folder, BUILD)
    assert status.where is MtpWhere.FETCHED and status.head_bytes == result.head_bytes == plan.head_bytes
    assert not plan.part_path.exists() and not plan.state_path.exists()


def test_a_cut_connection_resumes_with_only_the_missing_bytes(served, build_folder):
    plan = plan_mtp_fetch(build_folder, BUILD)
    served.cut("model-00002-of-00002.safetensors", after=3000, times=1)
    with pytest.raises(DownloadError) as caught:
        fetch_mtp_head(plan, attempts=1)
    assert caught.value.kind is DownloadErrorKind.NETWORK
    kept = plan.part_path.stat().st_size
    assert 0 < kept < plan.fetch_bytes and caught.value.bytes_kept == kept
    served.reset_log()
    result = fetch_mtp_head(plan_mtp_fetch(build_folder, BUILD))
    assert result.resumed_bytes == kept and result.bytes_fetched_this_run == plan.fetch_bytes - kept
    assert served.bytes_served("model-0000*") - _header_bytes(served) == plan.fetch_bytes - kept
    assert folder_status(build_folder, BUILD).where is MtpWhere.FETCHED


def _header_bytes(hub) -> int:
    return sum(r.body_bytes for r in hub.file_requests("*.safetensors") if r.range and r.range.startswith("bytes=0-"))


def test_retries_within_one_run_continue_where_the_cut_left_off(served, build_folder):
    plan = plan_mtp_fetch(build_folder, BUILD)
    served.reset_log()
    served.cut("model-00001-of-00002.safetensors", after=2000, times=2)
    result = fetch_mtp_head(plan, backoff_s=0.01)
    assert result.bytes_fetched_this_run == plan.fetch_bytes
    assert sum(r.body_bytes for r in served.file_requests("*.safetensors")) == plan.fetch_bytes


def test_the_errors_say_what_is_wrong(served, build_folder, mtp_repos):
    with pytest.raises(DownloadError, match="not found") as caught:
        plan_mtp_fetch(build_folder, BUILD, source_repo="nobody/missing")
    assert caught.value.kind is DownloadErrorKind.NOT_FOUND
    served.add_repo("Qwen/No-Head", {k: v for k, v in mtp_repos.build_files.items() if k != "README.md"})
    with pytest.raises(DownloadError, match="no MTP head") as caught:
        plan_mtp_fetch(build_folder, BUILD, source_repo="Qwen/No-Head")
    assert caught.value.kind is DownloadErrorKind.NOT_FOUND
    plan = plan_mtp_fetch(build_folder, BUILD)
    served.stop()
    with pytest.raises(DownloadError, match="cannot reach|connection") as caught:
        fetch_mtp_head(plan, attempts=2, backoff_s=0.01)
    assert caught.value.kind is DownloadErrorKind.NETWORK


def test_a_full_disk_is_refused_before_anything_is_fetched(served, build_folder, monkeypatch):
    from macapp.core.hub import mtp_fetch

    plan = plan_mtp_fetch(build_folder, BUILD)
    monkeypatch.setattr(mtp_fetch, "DISK_MARGIN", 10**18)  # more than any disk: the check must refuse
    served.reset_log()
    with pytest.raises(DownloadError, match="not enough disk space") as caught:
        fetch_mtp_head(plan)
    assert caught.value.kind is DownloadErrorKind.DISK_FULL and served.file_requests("*") == []


def test_a_cancel_stops_keeping_what_arrived(served, build_folder):
    from macapp.core.download import CancelToken, DownloadCancelled

    plan = plan_mtp_fetch(build_folder, BUILD)
    token = CancelToken()
    seen = []

    def progress(done, total):
        seen.append(done)
        if done >= plan.ranges[0].size:
            token.cancel()

    with pytest.raises(DownloadCancelled) as caught:
        fetch_mtp_head(plan, on_progress=progress, cancel=token)
    kept = plan.part_path.stat().st_size
    assert plan.ranges[0].size <= kept < plan.fetch_bytes and caught.value.bytes_kept == kept
    assert not plan.side_file.exists()
    assert fetch_mtp_head(plan).resumed_bytes == kept
