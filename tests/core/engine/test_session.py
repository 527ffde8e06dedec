"""A ChatSession through real mlx-lm on the tiny MoE model: turns, stop, regenerate/edit, reopened conversations
(macapp/core/engine/session.py; see macapp/core/demo/tiny_model.py for the greedy script)."""

from __future__ import annotations

import threading
import time

from mlx_lm.models.cache import QuantizedKVCache

from macapp.core import events as ev
from macapp.core.engine import SessionOptions
from macapp.core.engine.turns import replay
from macapp.core.events import AnswerDelta, Failed, Finished, PromptProgress, ReasoningDelta
from macapp.core.sampling import greedy
from macapp.core.demo.tiny_model import SCRIPT_REASONING
from tests.core.engine.helpers import ANSWER, EXACT, REASONING, TIMEOUT, cache_error, fresh_tokens, joined, kv_offsets, template


def test_thinking_on_streams_reasoning_then_answer(engine):
    job = engine.new_session().send("hello there", thinking=True, sampling=greedy(60))
    events = list(job.events(timeout=TIMEOUT))
    reply = job.result()
    assert (reply.reasoning, reply.text, reply.finish_reason) == (REASONING, ANSWER, "stop")
    assert joined(events, ReasoningDelta) == REASONING and joined(events, AnswerDelta) == ANSWER
    kinds = [type(e) for e in events if isinstance(e, (ReasoningDelta, AnswerDelta))]
    assert kinds.index(AnswerDelta) > max(i for i, k in enumerate(kinds) if k is ReasoningDelta)
    assert "<think>" not in reply.text + reply.reasoning and "</think>" not in reply.text + reply.reasoning
    assert isinstance(events[-1], Finished) and isinstance(events[0], PromptProgress)


def test_thinking_off_has_no_reasoning(engine):
    job = engine.new_session().send("hello there", thinking=False, sampling=greedy(60))
    events = list(job.events(timeout=TIMEOUT))
    reply = job.result()
    assert (reply.reasoning, reply.text, reply.stats.reasoning_tokens) == ("", ANSWER, 0)
    assert not any(isinstance(e, ReasoningDelta) for e in events)


def test_a_reply_that_never_closes_its_reasoning_then_the_next_turn(engine):
    s = engine.new_session()
    reply = s.send("hello", thinking=True, sampling=greedy(5)).result(timeout=TIMEOUT)
    assert reply.finish_reason == "length" and reply.text == ""
    assert reply.reasoning == "".join(SCRIPT_REASONING[:5]) and reply.stats.reasoning_tokens == 5
    nxt = s.send("go on", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert nxt.text == ANSWER
    text = engine.model.tokenizer.decode(s.tokens)
    assert "".join(SCRIPT_REASONING[:5]) + "\n</think>\n\n<|im_end|>\n<|im_start|>user\ngo on" in text  # closed, then appended


def test_only_the_new_turn_is_prefilled(engine):
    s = engine.new_session(system_prompt="be brief")
    first = s.send("hello there", thinking=True, sampling=greedy(60)).result(timeout=TIMEOUT)
    assert first.stats.prompt_tokens == len(template(engine, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}], True))
    for n, (text, thinking) in enumerate([("second question", False), ("a third, longer question about the cache", True)]):
        before = s.context_tokens
        reply = s.send(text, thinking=thinking, sampling=greedy(60)).result(timeout=TIMEOUT)
        new_turn = template(engine, [{"role": "user", "content": text}], thinking)
        assert reply.stats.prompt_tokens == 1 + len(new_turn)  # "\n" after the model's own <|im_end|>, then the turn
        assert s.context_tokens == before + reply.stats.prompt_tokens + reply.stats.generation_tokens
        assert kv_offsets(s) == [s.context_tokens]  # the cache holds exactly the tokens the session accounts for
        assert cache_error(engine, s) < EXACT
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]


def test_append_only_gives_the_same_tokens_as_a_fresh_full_prompt(engine, off_script):
    s = engine.new_session(system_prompt="You are terse.")
    for text, thinking in [("first question", True), ("second", False), ("and a third one", True)]:
        reply = s.send(text, thinking=thinking, sampling=off_script).result(timeout=TIMEOUT)
        assert len(reply.token_ids) == 40 and reply.finish_reason == "length"
    prompt = s.tokens[: len(s.tokens) - len(reply.token_ids)]
    assert fresh_tokens(engine, prompt, off_script) == reply.token_ids
    assert cache_error(engine, s) < EXACT  # the cache after three turns is the fresh state, logit for logit
    assert cache_error(engine, s, skip=3) > 100 * EXACT  # and the check is sensitive to the context
    # ... and that prompt is the conversation as the template writes it, plus the earlier replies kept whole
    tail = template(engine, [{"role": "user", "content": "and a third one"}], True)
    assert prompt[-len(tail) :] == tail
    # ... which is what a reopened conversation reads again: each reply in the tokens it left (turns.replay)
    assert replay(engine.model.tokenizer, s.system_prompt, s.messages[1:]) == (s.tokens, "<|im_end|>\n")


def test_stop_mid_stream_keeps_the_partial_reply_and_the_next_turn_works(engine, off_script):
    s = engine.new_session()
    job = s.send("tell me everything", thinking=False, sampling=off_script.with_overrides(max_tokens=100_000))
    seen = threading.Event()
    counter = {"n": 0}

    def listener(event):
        if isinstance(event, AnswerDelta):
            counter["n"] += 1
            if counter["n"] == 20:
                seen.set()

    job.add_listener(listener)
    assert seen.wait(TIMEOUT)
    job.stop()
    last = job.wait(5)
    latency = time.perf_counter() - job.stop_requested_at
    assert latency < 2.0  # generous: about one token's time
    reply = last.reply
    assert reply.finish_reason == "stopped" and reply.kept and len(reply.text) > 0
    assert s.messages[-1]["content"] == reply.text and s.messages[-1]["finish_reason"] == "stopped"
    assert kv_offsets(s) == [s.context_tokens] and cache_error(engine, s) < EXACT
    nxt = s.send("and now?", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert nxt.text == ANSWER and nxt.finish_reason == "stop"
    assert "<|im_end|>\n<|im_start|>user\nand now?" in engine.model.tokenizer.decode(s.tokens)


def test_stop_while_reading_rolls_the_turn_back(engine):
    s = engine.new_session(options=SessionOptions(prefill_step_size=8))
    s.send("hi", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    before_tokens, before_messages = list(s.tokens), s.messages
    job = s.send("word " * 200, thinking=False, sampling=greedy(30))
    reading = threading.Event()
    job.add_listener(lambda e: reading.set() if isinstance(e, PromptProgress) and e.processed > 0 else None)
    assert reading.wait(TIMEOUT)
    job.stop()
    reply = job.result(timeout=10)
    assert reply.finish_reason == "stopped" and not reply.kept
    job.join(TIMEOUT)  # the undo happens once the chunk in flight is done
    assert s.tokens == before_tokens and s.messages == before_messages and kv_offsets(s) == [len(before_tokens)]
    assert cache_error(engine, s) < EXACT
    again = s.send("short", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert again.stats.prompt_tokens == 1 + len(template(engine, [{"role": "user", "content": "short"}], False))
    assert again.text == ANSWER


def test_empty_prompt_is_refused_before_any_work(engine):
    s = engine.new_session()
    s.send("hi", thinking=False, sampling=greedy(20)).result(timeout=TIMEOUT)
    before = list(s.tokens)
    job = s.send("   \n", thinking=False)
    events = list(job.events(timeout=TIMEOUT))
    assert len(events) == 1 and isinstance(events[0], Failed) and events[0].code == ev.EMPTY_PROMPT
    assert s.tokens == before and len(s.messages) == 2


def test_regenerate_prefills_one_token_and_restores_the_exact_cache(engine, off_script):
    s = engine.new_session()
    s.send("first", thinking=True, sampling=greedy(60)).result(timeout=TIMEOUT)
    original = s.send("second", thinking=False, sampling=off_script).result(timeout=TIMEOUT)
    length = s.context_tokens
    again = s.regenerate(sampling=off_script).result(timeout=TIMEOUT)
    assert again.stats.prompt_tokens == 1
    assert again.token_ids == original.token_ids  # same state, same greedy tokens
    assert s.context_tokens == length and kv_offsets(s) == [length]
    assert cache_error(engine, s) < EXACT
    assert [m["role"] for m in s.messages] == ["user", "assistant", "user", "assistant"]
    assert s.snapshot_bytes > 0
    other = s.regenerate(thinking=True, sampling=greedy(60)).result(timeout=TIMEOUT)  # another mode: the user turn again
    assert other.stats.prompt_tokens == 1 + len(template(engine, [{"role": "user", "content": "second"}], True))
    assert (other.reasoning, other.text) == (REASONING, ANSWER)
    assert s.messages[-1]["thinking"] is True and cache_error(engine, s) < EXACT


def test_edit_last_prefills_only_the_new_message_and_matches_a_fresh_session(engine, off_script):
    s = engine.new_session(system_prompt="sys")
    s.send("first", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    s.send("a question with a typo", thinking=False, sampling=off_script).result(timeout=TIMEOUT)
    edited = s.edit_last("a question, fixed", sampling=off_script).result(timeout=TIMEOUT)
    assert edited.stats.prompt_tokens == 1 + len(template(engine, [{"role": "user", "content": "a question, fixed"}], False))
    assert [m["content"] for m in s.messages if m["role"] == "user"] == ["first", "a question, fixed"]
    fresh = engine.new_session(system_prompt="sys")
    fresh.send("first", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    reference = fresh.send("a question, fixed", thinking=False, sampling=off_script).result(timeout=TIMEOUT)
    assert edited.token_ids == reference.token_ids and s.tokens == fresh.tokens
    assert cache_error(engine, s) < EXACT


def test_regenerate_with_nothing_to_redo_fails_clearly(engine):
    last = engine.new_session().regenerate().wait(TIMEOUT)
    assert isinstance(last, Failed) and last.code == ev.NOTHING_TO_REDO


def test_a_reopened_conversation_is_read_once_then_appended(engine):
    history = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer", "reasoning": "old thoughts"},
    ]
    s = engine.new_session(messages=history)
    first = s.send("new question", thinking=True, sampling=greedy(60)).result(timeout=TIMEOUT)
    expected = template(engine, history[:1] + [history[1], {"role": "assistant", "content": "old answer"}, {"role": "user", "content": "new question"}], True)
    assert first.stats.prompt_tokens == len(expected) and s.tokens[: len(expected)] == expected
    assert "old thoughts" not in engine.model.tokenizer.decode(s.tokens)  # the template drops old reasoning
    second = s.send("next", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert second.stats.prompt_tokens == 1 + len(template(engine, [{"role": "user", "content": "next"}], False))
    assert cache_error(engine, s) < EXACT


def test_regenerate_on_a_reopened_conversation_reads_it_once(engine):
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    s = engine.new_session(messages=history)
    reply = s.regenerate(thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert reply.stats.prompt_tokens == len(template(engine, [history[0]], False)) and reply.text == ANSWER
    assert [m["role"] for m in s.messages] == ["user", "assistant"]


def test_quantized_kv_cache_works_across_turns_and_regenerate(engine):
    s = engine.new_session(options=SessionOptions(kv_bits=8))
    s.send("hello", thinking=True, sampling=greedy(60)).result(timeout=TIMEOUT)
    reply = s.send("again", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert isinstance(s.cache[-1], QuantizedKVCache)
    again = s.regenerate(sampling=greedy(30)).result(timeout=TIMEOUT)
    assert again.stats.prompt_tokens == 1 and again.token_ids == reply.token_ids
    assert kv_offsets(s) == [s.context_tokens]


def test_stopping_a_regenerate_that_rereads_the_conversation_keeps_the_message(engine):
    history = [{"role": "user", "content": "word " * 150}, {"role": "assistant", "content": "old"}]
    s = engine.new_session(messages=history, options=SessionOptions(prefill_step_size=8))
    job = s.regenerate(thinking=False, sampling=greedy(30))
    reading = threading.Event()
    job.add_listener(lambda e: reading.set() if isinstance(e, PromptProgress) and e.processed > 0 else None)
    assert reading.wait(TIMEOUT)
    job.stop()
    assert not job.result(timeout=10).kept
    job.join(TIMEOUT)
    assert [m["role"] for m in s.messages] == ["user"] and s.context_tokens == 0
    again = s.regenerate(thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    assert again.text == ANSWER and again.stats.prompt_tokens == len(template(engine, history[:1], False))
    assert cache_error(engine, s) < EXACT


def test_a_regenerate_from_a_snapshot_is_never_rolled_back(engine, off_script):
    s = engine.new_session(options=SessionOptions(prefill_step_size=4))
    s.send("word " * 40, thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    job = s.regenerate(thinking=True, sampling=off_script.with_overrides(max_tokens=100_000))  # re-reads the user turn
    job.stop()  # before or while it reads: it reads on, then stops at its first token
    reply = job.result(timeout=TIMEOUT)
    job.join(TIMEOUT)
    if reply.kept:  # stopped after reading: the turn is whole
        assert reply.finish_reason == "stopped" and reply.stats.generation_tokens >= 1
        assert [m["role"] for m in s.messages] == ["user", "assistant"] and cache_error(engine, s) < EXACT
    else:  # stopped before the job began: nothing changed
        assert [m["role"] for m in s.messages] == ["user", "assistant"] and s.messages[-1]["thinking"] is False


def test_stop_during_a_long_chunk_answers_at_once_and_undoes_the_turn(engine):
    s = engine.new_session(options=SessionOptions(prefill_step_size=100_000))  # the whole prompt in one chunk
    s.send("hi", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
    before = list(s.tokens)
    job = s.send("word " * 2500, thinking=False, sampling=greedy(30))
    reading = threading.Event()
    job.add_listener(lambda e: reading.set() if isinstance(e, PromptProgress) else None)
    assert reading.wait(TIMEOUT)
    time.sleep(0.05)
    job.stop()
    last = job.wait(1.0)  # the chunk itself takes seconds here
    assert time.perf_counter() - job.stop_requested_at < 1.0
    assert isinstance(last, Finished) and not last.reply.kept and last.reply.finish_reason == "stopped"
    nxt = s.send("short", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)  # runs after the undo
    assert nxt.stats.prompt_tokens == 1 + len(template(engine, [{"role": "user", "content": "short"}], False))
    assert s.tokens[: len(before)] == before and cache_error(engine, s) < EXACT
    assert [m["content"] for m in s.messages if m["role"] == "user"] == ["hi", "short"]
    assert sum(isinstance(e, Finished) for e in job.history) == 1
