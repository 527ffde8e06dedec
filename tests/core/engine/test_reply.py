"""One reply stream (macapp/core/engine/reply.py): thinking budget, context cap, and stream_reply on a cache of its own."""

from __future__ import annotations

from macapp.core.engine import SessionOptions
from macapp.core.events import ReasoningDelta
from macapp.core.sampling import greedy
from macapp.devtools.tiny_model import SCRIPT_REASONING
from tests.core.engine.helpers import ANSWER, EXACT, REASONING, TIMEOUT, cache_error, joined


def test_thinking_budget_closes_the_reasoning_and_the_model_answers(engine):
    s = engine.new_session()
    job = s.send("hello", thinking=True, sampling=greedy(60), thinking_budget=3)
    events = list(job.events(timeout=TIMEOUT))
    reply = job.result()
    assert reply.budget_hit and reply.stats.reasoning_tokens == 3 and reply.stats.forced_tokens == 3
    assert reply.reasoning == "".join(SCRIPT_REASONING[:3]) and reply.text == ANSWER and reply.finish_reason == "stop"
    assert joined(events, ReasoningDelta) == reply.reasoning
    assert "".join(SCRIPT_REASONING[:3]) + "\n</think>\n\n" + ANSWER in engine.model.tokenizer.decode(s.tokens)
    assert cache_error(engine, s) < EXACT
    zero = s.send("again", thinking=True, sampling=greedy(60), thinking_budget=0).result(timeout=TIMEOUT)
    assert (zero.reasoning, zero.text, zero.stats.reasoning_tokens) == ("", ANSWER, 0)
    roomy = s.send("more", thinking=True, sampling=greedy(60), thinking_budget=100).result(timeout=TIMEOUT)
    assert (roomy.reasoning, roomy.text, roomy.budget_hit) == (REASONING, ANSWER, False)


def test_a_reply_stops_at_the_context_limit(engine, off_script):
    s = engine.new_session(options=SessionOptions(context_limit=40))
    reply = s.send("hi", thinking=False, sampling=off_script.with_overrides(max_tokens=1000)).result(timeout=TIMEOUT)
    assert reply.finish_reason == "context" and s.context_tokens == 40
