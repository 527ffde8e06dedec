"""A sequence alone (engine/solo.py): read and decoded outside mlx-lm's batch, then handed to it when another
arrives, mid-reply or mid-prompt; every reply is the one it gets on the one-at-a-time path, token for token."""

from __future__ import annotations

import threading

import pytest

from macapp.core.engine import Engine, SessionOptions
from macapp.core.engine.options import MTPMode
from macapp.core.events import AnswerDelta, PromptProgress, ReasoningDelta
from macapp.core.sampling import greedy
from macapp.core.serving.requests import ChatMessage, Completed, FinishReason, Role
from macapp.core.serving.runner import ServingEngine, ServingOptions
from tests.core.serving.conftest import TIMEOUT
from tests.core.serving.test_runner import USER, ask, off_script


@pytest.fixture
def moe(engine):
    """The package's engine with the tiny MoE model (tests/core/engine/conftest.py)."""
    return engine


def sequential(moe, request) -> Completed:
    return ServingEngine(moe, ServingOptions(pool_bytes=0, batching=False)).submit(request).wait(TIMEOUT)


def when(job, seen) -> None:
    """Wait until one of `job`'s events satisfies `seen`."""
    while not any(seen(e) for e in list(job.history)):
        if job.done:
            pytest.fail("the job ended before the point the test waits for")
        threading.Event().wait(0.005)


def test_a_request_alone_runs_outside_the_batch_and_gives_the_one_at_a_time_reply(moe):
    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    batch = serving.batch
    alone, handed = batch.alone, batch.handed_over
    request = ask(USER, sampling=off_script(moe, 40))
    done = serving.submit(request).wait(TIMEOUT)
    assert batch.alone == alone + 1 and batch.handed_over == handed  # alone from start to end
    expected = sequential(moe, request)
    assert done.finish_reason is expected.finish_reason is FinishReason.LENGTH
    assert done.text == expected.text and done.usage == expected.usage and done.usage.completion_tokens == 40


def test_a_second_request_mid_reply_takes_the_first_into_the_batch_where_it_was(moe):
    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    batch = serving.batch
    handed = batch.handed_over
    first_request = ask(USER, sampling=off_script(moe, 120))
    second_request = ask(ChatMessage(Role.USER, "Another question entirely"), sampling=off_script(moe, 20))
    first = serving.submit(first_request)
    when(first, lambda e: isinstance(e, AnswerDelta))
    second = serving.submit(second_request)
    a, b = first.wait(TIMEOUT), second.wait(TIMEOUT)
    assert batch.handed_over == handed + 1
    for got, request in ((a, first_request), (b, second_request)):
        expected = sequential(moe, request)
        assert got.text == expected.text and got.usage == expected.usage, request


def test_a_second_request_mid_prompt_takes_the_first_into_the_batch_with_its_reading_so_far(moe):
    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    serving.batch.prefill_step = 64  # the long prompt is read in many chunks: the second arrives between two
    try:
        handed = serving.batch.handed_over
        long_request = ask(ChatMessage(Role.USER, "word " * 1500), sampling=off_script(moe, 16))
        short_request = ask(USER, sampling=off_script(moe, 8))
        long = serving.submit(long_request)
        when(long, lambda e: isinstance(e, PromptProgress) and 0 < e.processed < e.total)
        short = serving.submit(short_request)
        a, b = long.wait(TIMEOUT), short.wait(TIMEOUT)
        assert serving.batch.handed_over == handed + 1
        progress = [e.processed for e in long.history if isinstance(e, PromptProgress)]
        assert progress == sorted(progress)  # the reading goes on from where it was, never back
        for got, request in ((a, long_request), (b, short_request)):
            expected = sequential(moe, request)
            assert got.text == expected.text and got.usage == expected.usage, request
    finally:
        serving.batch.prefill_step = 2048


def test_the_thinking_budget_closes_the_reasoning_alone_and_at_a_hand_over(moe):
    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    request = ask(USER, thinking=True, thinking_budget=3)
    alone = serving.submit(request).wait(TIMEOUT)
    expected = sequential(moe, request)
    assert alone.reasoning == expected.reasoning and alone.text == expected.text and alone.usage == expected.usage
    first = serving.submit(request)
    when(first, lambda e: isinstance(e, ReasoningDelta))
    other = serving.submit(ask(USER, sampling=greedy(4)))
    handed = first.wait(TIMEOUT)
    other.wait(TIMEOUT)
    assert handed.reasoning == expected.reasoning and handed.text == expected.text and handed.usage == expected.usage


def test_a_stop_while_alone_ends_the_reply_within_a_token(moe):
    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    job = serving.submit(ask(USER, sampling=off_script(moe, 400)))
    when(job, lambda e: isinstance(e, AnswerDelta))
    job.stop()
    done = job.wait(TIMEOUT)
    assert done.usage.completion_tokens < 400


def both_in_the_batch(serving, engine, first_request, second_request):
    """Submit both while the worker is busy, so the batch takes them together (neither begins alone)."""
    release = threading.Event()
    blocker = engine.submit("test", lambda _job: release.wait(TIMEOUT))
    try:
        first, second = serving.submit(first_request), serving.submit(second_request)
    finally:
        release.set()
    blocker.wait(TIMEOUT)
    return first, second


def test_the_one_left_when_the_others_end_goes_on_alone_with_the_one_at_a_time_reply(moe):
    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    batch = serving.batch
    alone, again = batch.alone, batch.alone_again
    long_request = ask(USER, sampling=off_script(moe, 120))
    short_request = ask(ChatMessage(Role.USER, "Another question entirely"), sampling=off_script(moe, 12))
    first, second = both_in_the_batch(serving, moe, long_request, short_request)
    a, b = first.wait(TIMEOUT), second.wait(TIMEOUT)
    assert batch.alone == alone and batch.alone_again == again + 1  # began in the batch, ended alone
    for got, request in ((a, long_request), (b, short_request)):
        expected = sequential(moe, request)
        assert got.text == expected.text and got.usage == expected.usage, request


def test_the_one_left_alone_drafts_with_the_mtp_head_again(tiny_mtp):
    """Above one sequence the batch decodes plainly; once the others end, the one left drafts again (solo.py)."""
    e = Engine()
    try:
        e.load(str(tiny_mtp("moe", "right"))).result(timeout=TIMEOUT)
        serving = ServingEngine(e, ServingOptions(session=SessionOptions(mtp=MTPMode.ON), pool_bytes=0))
        long_request, short_request = ask(USER, max_tokens=96), ask(ChatMessage(Role.USER, "Another question entirely"), max_tokens=8)
        first, second = both_in_the_batch(serving, e, long_request, short_request)
        a, b = first.wait(TIMEOUT), second.wait(TIMEOUT)
        assert serving.batch.alone == 0 and serving.batch.alone_again == 1
        assert b.mtp_tokens_per_step is None  # never alone: plain in the batch
        assert a.mtp_tokens_per_step is not None and a.mtp_tokens_per_step > 1.5  # the always-right head, alone again
        plain = ServingEngine(e, ServingOptions(session=SessionOptions(mtp=MTPMode.OFF), pool_bytes=0, batching=False))
        for got, request in ((a, long_request), (b, short_request)):
            expected = plain.submit(request).wait(TIMEOUT)
            assert got.text == expected.text and got.usage == expected.usage, request
    finally:
        e.close()
