"""A reply (macapp/core/engine/reply.py, run alone by solo.py): thinking budget, context cap, and a reply on a cache of its own."""

from __future__ import annotations

from macapp.core.engine import SessionOptions, TurnClock, prefill
from macapp.core.events import AnswerDelta, Finished, PromptProgress, ReasoningDelta, StatsUpdate
from macapp.core.sampling import greedy
from macapp.core.demo.tiny_model import SCRIPT_REASONING
from tests.core.engine.helpers import ANSWER, EXACT, REASONING, TIMEOUT, cache_error, joined, logit_error, on_worker, stream_alone, template


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


def _own_cache_reply(engine, message, thinking=True, limit=10_000, **kwargs):
    """A lone reply on a cache made here (not a session's): the prompt prefilled, its last token fed by the reply."""
    from mlx_lm.models.cache import make_prompt_cache

    prompt = template(engine, [{"role": "user", "content": message}], thinking)
    events = []

    def run(m):
        cache = make_prompt_cache(m.model)
        clock = TurnClock()
        clock.reading(len(prompt))
        read = prefill(m, cache, prompt[:-1], step=8)
        streamed = stream_alone(m, cache, prompt[-1:], held=prompt[:read], limit=limit, thinking=thinking, emit=events.append, clock=clock, **kwargs)
        return cache, streamed

    cache, streamed = on_worker(engine, run)
    return prompt, cache, streamed, events


def test_a_lone_reply_works_on_a_cache_that_is_not_a_sessions(engine):
    prompt, cache, (reply, still_reasoning, added), events = _own_cache_reply(engine, "hello there", params=greedy(60))
    assert (reply.reasoning, reply.text, reply.finish_reason, still_reasoning) == (REASONING, ANSWER, "stop", False)
    assert added == prompt[-1:] + reply.token_ids
    assert reply.stats.prompt_tokens == len(prompt) and reply.stats.context_tokens == len(prompt) + len(reply.token_ids)
    assert [c.offset for c in cache if c.is_trimmable()] == [reply.stats.context_tokens]
    assert logit_error(engine, cache, prompt + reply.token_ids) < EXACT
    assert events[0] == PromptProgress(len(prompt), len(prompt)) and any(isinstance(e, StatsUpdate) for e in events)
    assert joined(events, ReasoningDelta) == REASONING and joined(events, AnswerDelta) == ANSWER
    assert not any(isinstance(e, Finished) for e in events)  # the terminal event is the caller's
    session_reply = engine.new_session().send("hello there", thinking=True, sampling=greedy(60)).result(timeout=TIMEOUT)
    assert session_reply.token_ids == reply.token_ids


def test_a_lone_reply_stops_when_asked_and_reports_a_reasoning_left_open(engine, off_script):
    asked = []
    _, cache, (reply, still_reasoning, added), _ = _own_cache_reply(
        engine,
        "go",
        params=off_script.with_overrides(max_tokens=1000),
        should_stop=lambda: asked.append(1) or len(asked) >= 5,
    )
    assert reply.finish_reason == "stopped" and len(reply.token_ids) == 5 and len(asked) == 5
    assert still_reasoning and reply.text == "" and reply.stats.reasoning_tokens == 5


def test_a_lone_reply_keeps_to_the_context_limit_and_the_thinking_budget(engine, off_script):
    prompt, cache, (reply, _, added), _ = _own_cache_reply(engine, "hi", params=off_script.with_overrides(max_tokens=1000), limit=0)
    assert reply.finish_reason == "context" and reply.token_ids == [] and added == []  # no room at all: nothing fed
    limit = len(template(engine, [{"role": "user", "content": "hi"}], True)) + 7
    prompt, cache, (reply, _, added), _ = _own_cache_reply(engine, "hi", params=off_script.with_overrides(max_tokens=1000), limit=limit)
    assert reply.finish_reason == "context" and [c.offset for c in cache if c.is_trimmable()] == [limit]
    assert len(prompt) - 1 + len(added) == limit
    prompt, cache, (reply, still_reasoning, added), _ = _own_cache_reply(engine, "hi", params=greedy(60), budget=2)
    assert reply.budget_hit and reply.stats.reasoning_tokens == 2 and not still_reasoning
    assert reply.stats.forced_tokens == len(added) - 1 - len(reply.token_ids) > 0  # the closing tag went into the cache
    assert reply.text == ANSWER and logit_error(engine, cache, prompt[:-1] + added) < EXACT


def test_a_leading_space_the_detokenizer_drops_is_given_back(engine):
    """mlx-lm's BPE streaming detokenizer trims the first space of a stream; a reply that continues a prompt keeps it."""
    from macapp.core.engine.reply import leading_space

    tok = engine.model.tokenizer
    is_, the = tok.encode(" is", add_special_tokens=False), tok.encode("The", add_special_tokens=False)
    detok = tok.detokenizer
    for t in is_:
        detok.add_token(t)
    detok.finalize()
    assert detok.text == "is"  # what mlx-lm streams
    assert leading_space(tok, is_, detok.text) == " is"
    assert leading_space(tok, the, "The") == "The"
    assert leading_space(tok, is_, " is") == " is"
