"""MTP through a ChatSession (the window's and the CLI's path): every kind of turn gives the plain decode's reply,
and the conversation's MTP measurements carry across its turns."""

from __future__ import annotations

import pytest

from macapp.core.engine import Engine, SessionOptions
from macapp.core.engine.options import MTPMode
from macapp.core.sampling import greedy
from tests.core.engine.helpers import EXACT, TIMEOUT, cache_error
from tests.fixtures.scripted import TOOL_CALL_ANSWER


@pytest.fixture(scope="module")
def mtp_engine(tiny_mtp):
    e = Engine()
    e.load(str(tiny_mtp("moe", "successor"))).result(timeout=TIMEOUT)
    yield e
    e.close()


def pair(engine):
    return (engine.new_session(options=SessionOptions(mtp=MTPMode.OFF)), engine.new_session(options=SessionOptions(mtp=MTPMode.ON)))


def banned(engine, n=40):
    vocab = engine.model.tokenizer.get_vocab()
    return greedy(n, logit_bias={vocab["<|im_end|>"]: -1e9, vocab["<|endoftext|>"]: -1e9})


def same(a, b):
    assert (b.text, b.reasoning, b.finish_reason, b.token_ids) == (a.text, a.reasoning, a.finish_reason, a.token_ids)
    assert b.stats.context_tokens == a.stats.context_tokens


def test_turns_regenerate_and_edit_give_the_plain_replies(mtp_engine):
    plain, fast = pair(mtp_engine)
    turns = [
        lambda s: s.send("hello there", thinking=True, sampling=greedy(60)),
        lambda s: s.send("and now?", thinking=False, sampling=banned(mtp_engine)),
        lambda s: s.regenerate(sampling=banned(mtp_engine, 30)),  # back to a checkpoint, then a new reply
        lambda s: s.edit_last("something else entirely", thinking=True, sampling=banned(mtp_engine, 30)),
        lambda s: s.send("one more", thinking=True, sampling=greedy(60)),
    ]
    for turn in turns:
        a, b = turn(plain).result(timeout=TIMEOUT), turn(fast).result(timeout=TIMEOUT)
        same(a, b)
        assert a.stats.mtp_steps == 0
    assert fast.tokens == plain.tokens and fast.messages == plain.messages
    assert cache_error(mtp_engine, fast) < EXACT + cache_error(mtp_engine, plain)
    policy = fast.mtp_policy
    assert policy.rounds > 10 and 0 < policy.kept < policy.looked  # measured across the turns, kept and rejected
    assert b.stats.mtp_steps > 0 and 0 < b.stats.mtp_acceptance <= 1 and b.stats.mtp_tokens_per_step >= 1


def test_a_tool_call_comes_out_the_same(tiny_mtp):
    e = Engine()
    try:
        e.load(str(tiny_mtp("dense", "successor", answer=tuple(TOOL_CALL_ANSWER)))).result(timeout=TIMEOUT)
        plain, fast = pair(e)
        a = plain.send("weather in Paris?", thinking=True, sampling=greedy(80)).result(timeout=TIMEOUT)
        b = fast.send("weather in Paris?", thinking=True, sampling=greedy(80)).result(timeout=TIMEOUT)
        same(a, b)
        assert "<tool_call>" in b.text and "<function=get_weather>" in b.text and b.stats.mtp_accepted > 0
    finally:
        e.close()


def test_auto_is_the_default_and_a_build_without_a_head_decodes_plainly(engine):
    s = engine.new_session()
    assert s.options.mtp is MTPMode.AUTO
    reply = s.send("hello there", sampling=greedy(30)).result(timeout=TIMEOUT)
    assert reply.stats.mtp_steps == 0 and engine.model.mtp_head is None
