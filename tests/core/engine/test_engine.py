"""The Engine: a model at a time, sessions following it, close (macapp/core/engine/engine.py)."""

from __future__ import annotations

import threading

import pytest

from macapp.core import events as ev
from macapp.core.engine import Engine
from macapp.core.engine.turns import replay
from macapp.core.events import AnswerDelta, Failed
from macapp.core.sampling import greedy
from tests.core.engine.helpers import ANSWER, TIMEOUT, template


def test_chat_without_a_model_fails_clearly():
    e = Engine()
    try:
        last = e.new_session().send("hi").wait(TIMEOUT)
        assert isinstance(last, Failed) and last.code == ev.NO_MODEL
    finally:
        e.close()


def test_a_session_follows_a_newly_loaded_model_by_reading_the_conversation_once(tiny_moe_path, tiny_dense_path):
    e = Engine()
    try:
        e.load(str(tiny_moe_path)).result(timeout=TIMEOUT)
        s = e.new_session()
        s.send("hello", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
        e.load(str(tiny_dense_path)).result(timeout=TIMEOUT)
        assert s.cache is None and s.context_tokens == 0  # the old model's cache is freed with it
        reply = s.send("again", thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT)
        # read as the session held it: the first turn as it was sampled (its empty think block kept), then the new one
        tokenizer = e.model.tokenizer
        first = template(e, [{"role": "user", "content": "hello"}], False) + list(tokenizer.encode(ANSWER + "<|im_end|>", add_special_tokens=False))
        assert replay(tokenizer, None, s.messages[:2]) == (first, "\n")
        expected = first + list(tokenizer.encode("\n", add_special_tokens=False)) + template(e, [{"role": "user", "content": "again"}], False)
        assert reply.stats.prompt_tokens == len(expected) and s.tokens[: len(expected)] == expected and reply.text == ANSWER
    finally:
        e.close()


def test_close_stops_a_running_reply(tiny_moe_path, off_script):
    e = Engine()
    e.load(str(tiny_moe_path)).result(timeout=TIMEOUT)
    job = e.new_session().send("go", thinking=False, sampling=off_script.with_overrides(max_tokens=100_000))
    started = threading.Event()
    job.add_listener(lambda event: started.set() if isinstance(event, AnswerDelta) else None)
    assert started.wait(TIMEOUT)
    e.close()
    assert job.result(timeout=10).finish_reason == "stopped" and e.loaded is None
    with pytest.raises(RuntimeError, match="closed"):
        e.new_session().send("again")
