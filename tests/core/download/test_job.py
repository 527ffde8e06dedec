"""DownloadJob: one run's events, in order, leave the state a front end shows (no Qt, no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from macapp.core import download as dl
from macapp.core.download.job import DownloadJob, JobState


def _progress(done: int, total: int = 100) -> dl.Progress:
    return dl.Progress(done, total, done, 10.0, 1.0, 0.0, (dl.FileProgress("model.safetensors", total, done, dl.FileState.DOWNLOADING),))


def test_progress_notices_and_retries_are_kept_while_it_runs():
    job = DownloadJob("org/model")
    assert job.state is JobState.RUNNING and job.last is None and job.bytes_kept == 0
    job.apply(_progress(40))
    job.apply(dl.Notice("picked up 10 bytes"))
    assert job.last.bytes_done == 40 and job.notice == "picked up 10 bytes"
    job.apply(dl.Retrying("sub/model-00001.safetensors", 2, 6, 1.0, "connection dropped"))
    assert job.notice == "Retrying model-00001.safetensors (attempt 2 of 6): connection dropped"
    job.apply(dl.Stalled(5.0))  # shown through the progress snapshot, not kept here
    assert job.state is JobState.RUNNING and job.bytes_kept == 40


def test_a_stop_keeps_what_is_on_disk():
    job = DownloadJob("org/model")
    job.apply(_progress(40))
    job.apply(dl.DownloadStopped(bytes_kept=55))
    assert job.state is JobState.PAUSED and job.bytes_kept == 55


@pytest.mark.parametrize("kind", ["network", "disk_full"])
def test_a_failure_keeps_its_error(kind):
    job = DownloadJob("org/model")
    error = dl.DownloadError(kind, "it broke", repo="org/model")
    job.apply(dl.DownloadFailed(error))
    assert job.state is JobState.FAILED and job.error is error and job.error.kind == kind


def test_finished_is_done():
    job = DownloadJob("org/model")
    result = dl.DownloadResult("org/model", "main", "abc", Path("/x"), 1, 1, ("a",), True, 0.1)
    job.apply(dl.DownloadFinished(result))
    assert job.state is JobState.DONE


def test_each_job_has_its_own_cancel_token():
    a, b = DownloadJob("a/a"), DownloadJob("b/b")
    a.token.cancel()
    assert a.token.cancelled and not b.token.cancelled
