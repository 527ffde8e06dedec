"""A chat turn as one sequence of the engine's batch loop (ChatSession.turn_sequence): beside the API's requests the
window's chat joins mlx-lm's batch, and the conversation goes on exactly as it does on its own."""

from __future__ import annotations

import threading

import pytest

from macapp.core.engine import Engine, SessionOptions
from macapp.core.engine.options import MTPMode
from macapp.core.engine.turns import replay
from macapp.core.events import AnswerDelta
from macapp.core.sampling import greedy
from macapp.core.serving.requests import ChatMessage, Completed, Role
from macapp.core.serving.runner import ServingEngine, ServingOptions
from tests.core.engine.helpers import HEAD_CONTEXT_TURNS, assert_head_context_covers_every_token
from tests.core.serving.test_runner import ask, off_script

TIMEOUT = 120


def conversation(session, engine) -> list:
    """send, send (thinking), regenerate, edit, send with a budget: each reply's text and the tokens after it."""
    sampling = off_script(engine, 12)
    out = []
    for job in (
        lambda: session.send("Tell me about rivers", thinking=False, sampling=sampling),
        lambda: session.send("And lakes?", thinking=True, sampling=sampling),
        lambda: session.regenerate(sampling=sampling),
        lambda: session.edit_last("And seas?", sampling=sampling),
        lambda: session.send("Briefly.", thinking=True, sampling=greedy(30), thinking_budget=3),
    ):
        reply = job().result(TIMEOUT)
        out.append((reply.text, reply.reasoning, reply.finish_reason, list(session.tokens)))
        # the conversation read again (a reopening) is the cache, token for token: each reply in its cache_tokens
        assert replay(engine.model.tokenizer, None, session.messages)[0] == session.tokens
    return out


@pytest.fixture
def moe(engine):
    """The package's engine with the tiny MoE model (tests/core/engine/conftest.py)."""
    return engine


def test_a_conversation_beside_a_long_api_reply_goes_exactly_as_on_its_own(moe):
    """Every turn is a sequence of the engine's one batch loop: alone it runs in the lone executor (solo.py), beside a
    long API reply in mlx-lm's BatchGenerator; the conversation is the same token for token."""
    batch = moe.batch_loop()
    alone_before, handed_before = batch.alone, batch.handed_over
    alone = conversation(moe.new_session(), moe)
    assert batch.alone - alone_before == 5 and batch.handed_over == handed_before  # each turn alone, in the loop
    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    try:
        long = serving.submit(ask(ChatMessage(Role.USER, "A long story"), sampling=off_script(moe, 3000)))
        while not any(isinstance(e, AnswerDelta) for e in long.history):
            threading.Event().wait(0.01)
        peak_before = batch.peak
        beside = conversation(moe.new_session(), moe)
        assert not long.done  # every turn shared the batch with it
        assert batch.handed_over > handed_before and batch.peak >= max(2, peak_before)
        long.stop()
        long.wait(TIMEOUT)
    finally:
        serving.close()
    assert beside == alone


def test_a_chat_turn_joins_the_batch_of_a_long_api_reply_and_ends_first(moe):
    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    try:
        long = serving.submit(ask(ChatMessage(Role.USER, "A long story"), sampling=off_script(moe, 300)))
        while not any(isinstance(e, AnswerDelta) for e in long.history):
            threading.Event().wait(0.01)
        session = moe.new_session()
        reply = session.send("Hello there", thinking=False, sampling=greedy(8)).result(TIMEOUT)
        assert not long.done  # the chat did not wait for the agent's reply
        assert reply.text and reply.stats.generation_tps > 0  # its own meter
        assert isinstance(long.wait(TIMEOUT), Completed)
    finally:
        serving.close()


def test_a_stop_while_the_batch_reads_the_prompt_undoes_the_turn(moe):
    serving = ServingEngine(moe, ServingOptions(pool_bytes=0))
    try:
        session = moe.new_session()
        session.send("First", thinking=False, sampling=greedy(8)).result(TIMEOUT)
        messages, tokens = session.messages, list(session.tokens)
        gate = threading.Event()
        held = moe.submit("hold", lambda job: gate.wait(TIMEOUT))
        job = session.send("word " * 3000, thinking=False, sampling=greedy(8))
        job.stop()
        gate.set()
        held.join(TIMEOUT)
        undone = job.result(TIMEOUT)
        job.join(TIMEOUT)
        assert undone.kept is False and undone.finish_reason == "stopped"
        assert session.messages == messages and session.tokens == tokens
        again = session.send("Second", thinking=False, sampling=greedy(8)).result(TIMEOUT)
        assert again.kept and again.text
    finally:
        serving.close()


def test_a_turn_alone_in_the_batch_drafts_and_hands_the_heads_context_back(tiny_mtp):
    """With a server up, a chat turn alone in the batch drafts with the MTP head (solo.py) and the conversation goes
    on from the head's context the batch hands back: after each turn, regenerate included, it covers every token
    from the first, as in a conversation with no server (tests/core/engine/test_mtp_context.py)."""
    e = Engine()
    try:
        e.load(str(tiny_mtp("moe", "successor"))).result(timeout=TIMEOUT)
        serving = ServingEngine(e, ServingOptions(pool_bytes=0))
        plain = e.new_session(options=SessionOptions(mtp=MTPMode.OFF))
        fast = e.new_session(options=SessionOptions(mtp=MTPMode.ON))
        for turn in HEAD_CONTEXT_TURNS:
            steps = serving.batch.steps
            a, b = turn(plain).result(timeout=TIMEOUT), turn(fast).result(timeout=TIMEOUT)
            assert serving.batch.steps > steps  # both ran in the batch
            assert (b.text, b.reasoning, b.token_ids) == (a.text, a.reasoning, a.token_ids)
            assert b.stats.mtp_steps > 0 and a.stats.mtp_steps == 0
            assert_head_context_covers_every_token(fast)
        assert plain._live.head is None
        serving.close()
    finally:
        e.close()
