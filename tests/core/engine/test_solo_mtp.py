"""MTP for a sequence alone (engine/solo.py drafting with mtp_decode's rounds): a lone request or chat turn drafts
with the build's head and gives token for token the reply it gets without it; a second arrival hands it over to
the batch, which decodes plain, and both replies are their one-at-a-time ones."""

from __future__ import annotations

import pytest

from macapp.core.engine import Engine, SessionOptions
from macapp.core.engine.options import MTPMode
from macapp.core.events import AnswerDelta, ReasoningDelta
from macapp.core.sampling import greedy
from macapp.core.serving.requests import ChatMessage, Completed, Role
from macapp.core.serving.runner import ServingEngine, ServingOptions
from tests.core.engine.test_solo import when
from tests.core.serving.conftest import TIMEOUT
from tests.core.serving.test_runner import USER, ask, off_script


@pytest.fixture(scope="module", params=["right", "random"])
def head_engine(request, tiny_mtp):
    """An engine with the tiny MoE model and an MTP head: always right (every draft kept) or random (most rejected)."""
    e = Engine()
    e.load(str(tiny_mtp("moe", request.param))).result(timeout=TIMEOUT)
    assert e.model.mtp_head is not None
    yield e
    e.close()


def serving(engine: Engine, mode: MTPMode, batching: bool = True) -> ServingEngine:
    return ServingEngine(engine, ServingOptions(session=SessionOptions(mtp=mode), pool_bytes=0, batching=batching))


def sequential(engine: Engine, request) -> Completed:
    """The one-at-a-time path without MTP: the reference reply."""
    return serving(engine, MTPMode.OFF, batching=False).submit(request).wait(TIMEOUT)


def same(got: Completed, expected: Completed) -> None:
    assert (got.text, got.reasoning, got.finish_reason, got.usage) == (expected.text, expected.reasoning, expected.finish_reason, expected.usage)


def test_a_lone_request_drafts_and_gives_the_reply_it_gets_without_mtp(head_engine):
    on, off = serving(head_engine, MTPMode.ON), serving(head_engine, MTPMode.OFF)
    batch = on.batch
    for request in (ask(USER, sampling=off_script(head_engine, 40)), ask(USER, sampling=greedy(40)), ask(ChatMessage(Role.USER, "one two three"))):
        alone, drafted, handed = batch.alone, batch.mtp.drafted, batch.handed_over
        fast = on.submit(request).wait(TIMEOUT)
        assert batch.alone == alone + 1 and batch.handed_over == handed  # alone from start to end
        assert batch.mtp.drafted > drafted  # the head drafted for it
        drafted = batch.mtp.drafted
        plain = off.submit(request).wait(TIMEOUT)
        assert batch.mtp.drafted == drafted  # --mtp off: no drafts
        same(fast, plain)
        same(fast, sequential(head_engine, request))


def test_the_thinking_budget_and_a_stop_mid_round_alone(head_engine):
    on = serving(head_engine, MTPMode.ON)
    request = ask(USER, thinking=True, thinking_budget=5, sampling=greedy(30))
    same(on.submit(request).wait(TIMEOUT), sequential(head_engine, request))
    job = on.submit(ask(USER, sampling=off_script(head_engine, 400)))
    when(job, lambda e: isinstance(e, AnswerDelta))
    job.stop()
    assert job.wait(TIMEOUT).usage.completion_tokens < 400


@pytest.mark.parametrize("mid", [AnswerDelta, ReasoningDelta])
def test_a_second_request_mid_reply_takes_the_drafting_one_into_the_batch(head_engine, mid):
    on = serving(head_engine, MTPMode.ON)
    batch = on.batch
    handed, drafted = batch.handed_over, batch.mtp.drafted
    thinking = mid is ReasoningDelta
    first_request = ask(USER, thinking=thinking, sampling=off_script(head_engine, 160))
    second_request = ask(ChatMessage(Role.USER, "Another question entirely"), sampling=off_script(head_engine, 20))
    first = on.submit(first_request)
    when(first, lambda e: isinstance(e, mid))
    second = on.submit(second_request)
    a, b = first.wait(TIMEOUT), second.wait(TIMEOUT)
    assert batch.handed_over == handed + 1 and batch.mtp.drafted > drafted  # it drafted, then went on in the batch
    same(a, sequential(head_engine, first_request))
    same(b, sequential(head_engine, second_request))


def test_a_chat_turn_alone_in_the_batch_reports_its_mtp_figures(head_engine):
    api = serving(head_engine, MTPMode.ON)
    try:
        fast = head_engine.new_session(options=SessionOptions(mtp=MTPMode.ON)).send("Tell me about rivers", thinking=False, sampling=greedy(24))
        fast_reply = fast.result(TIMEOUT)
    finally:
        api.close()
    plain = head_engine.new_session(options=SessionOptions(mtp=MTPMode.OFF)).send("Tell me about rivers", thinking=False, sampling=greedy(24))
    plain_reply = plain.result(TIMEOUT)
    assert (fast_reply.text, fast_reply.token_ids) == (plain_reply.text, plain_reply.token_ids)
    stats = fast_reply.stats
    assert stats.mtp_drafted > 0 and stats.mtp_steps > 0 and stats.mtp_passes > 0
    assert plain_reply.stats.mtp_drafted == 0
