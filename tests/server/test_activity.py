"""The server's request list: records follow a job's events; stop_all stops what is in flight."""

from __future__ import annotations

import dataclasses

from macapp.core.engine import Job
from macapp.core.events import AnswerDelta, Failed, PromptProgress
from macapp.core.serving.requests import Completed, FinishReason, RequestStarted, Usage
from macapp.server.activity import Activity, RequestState


def completed(reason=FinishReason.STOP) -> Completed:
    return Completed("hi", "", (), reason, Usage(prompt_tokens=50, cached_tokens=40, completion_tokens=3), generation_tps=12.5)


def test_a_record_follows_its_job_to_the_end():
    activity = Activity()
    seen = []
    activity.add_observer(seen.append)
    job = Job("serve")
    record = activity.track(job, "127.0.0.1:5000 openai", "openai", prompt_tokens=50)
    assert record.state is RequestState.WAITING and activity.busy()
    job.emit(PromptProgress(0, 10))
    job.emit(AnswerDelta("h"))
    job.emit(AnswerDelta("i"))  # no change the list shows: no notification
    job.emit(completed())
    states = [r.state for r in seen]
    assert states == [RequestState.WAITING, RequestState.READING, RequestState.ANSWERING, RequestState.DONE]
    last = activity.records()[-1]
    assert (last.prompt_tokens, last.cached_tokens, last.completion_tokens, last.tokens_per_s) == (50, 40, 3, 12.5)
    assert (last.mtp_tokens_per_step, last.mtp_acceptance) == (None, None)  # the head did not draft
    assert not activity.busy()


def test_a_reply_the_mtp_head_drafted_for_keeps_its_figures():
    activity = Activity()
    job = Job("serve")
    activity.track(job, "127.0.0.1:5000 openai", "openai", prompt_tokens=50)
    job.emit(dataclasses.replace(completed(), mtp_tokens_per_step=2.5, mtp_acceptance=0.75))
    assert (activity.records()[-1].mtp_tokens_per_step, activity.records()[-1].mtp_acceptance) == (2.5, 0.75)


def test_the_reused_tokens_show_as_soon_as_the_engine_takes_the_request():
    activity = Activity()
    job = Job("serve")
    activity.track(job, "c", "anthropic", prompt_tokens=50)
    job.emit(RequestStarted(prompt_tokens=52, cached_tokens=40))
    record = activity.records()[-1]
    assert (record.state, record.prompt_tokens, record.cached_tokens) == (RequestState.READING, 52, 40)


def test_cancelled_and_failed_requests():
    activity = Activity()
    a, b = Job("serve"), Job("serve")
    activity.track(a, "a", "openai", 1)
    activity.track(b, "b", "anthropic", 1)
    a.emit(completed(FinishReason.CANCELLED))
    b.emit(Failed("The prompt is too long.", "context_limit"))
    by_client = {r.client: r for r in activity.records()}
    assert by_client["a"].state is RequestState.STOPPED
    assert by_client["b"].state is RequestState.FAILED and "too long" in by_client["b"].error


def test_stop_all_stops_every_job_in_flight():
    activity = Activity()
    jobs = [Job("serve") for _ in range(3)]
    for job in jobs:
        activity.track(job, "c", "openai", 1)
    jobs[0].emit(completed())
    activity.stop_all()
    assert [j.stopped for j in jobs] == [False, True, True]


def test_old_finished_records_are_dropped():
    activity = Activity(keep=3)
    for i in range(5):
        job = Job("serve")
        activity.track(job, f"c{i}", "openai", 1)
        job.emit(completed())
    assert [r.client for r in activity.records()] == ["c2", "c3", "c4"]


def test_a_broken_observer_does_not_break_tracking(caplog):
    activity = Activity()
    activity.add_observer(lambda r: 1 / 0)
    seen = []
    activity.add_observer(seen.append)
    job = Job("serve")
    with caplog.at_level("ERROR", logger="macapp.server.activity"):
        activity.track(job, "c", "openai", 1)
        job.emit(completed())
    assert activity.records()[0].state is RequestState.DONE
    assert [r.state for r in seen] == [RequestState.WAITING, RequestState.DONE]  # the next observer still told
    broken = [r for r in caplog.records if r.exc_info and r.exc_info[0] is ZeroDivisionError]
    assert len(broken) == 2  # logged with its traceback, once per notification, not swallowed
