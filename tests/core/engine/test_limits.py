"""What a turn may ask for (macapp/core/engine/limits.py): refused before any work, the session untouched."""

from __future__ import annotations

from macapp.core import events as ev
from macapp.core.engine import SessionOptions
from macapp.core.events import Failed
from macapp.core.sampling import greedy
from tests.core.engine.helpers import ANSWER, TIMEOUT


def test_a_prompt_over_the_context_limit_is_refused_before_any_work(engine):
    s = engine.new_session(options=SessionOptions(context_limit=64))
    s.send("hi", thinking=False, sampling=greedy(20)).result(timeout=TIMEOUT)
    before = list(s.tokens)
    job = s.send("word " * 80, thinking=False)
    events = list(job.events(timeout=TIMEOUT))
    assert len(events) == 1 and events[0].code == ev.CONTEXT_LIMIT
    assert "context" in events[0].message and "64" in events[0].message
    assert s.tokens == before
    ok = s.send("ok", thinking=False, sampling=greedy(20)).result(timeout=TIMEOUT)
    assert ok.text == ANSWER


def test_a_prompt_over_the_memory_budget_is_refused(engine):
    s = engine.new_session(options=SessionOptions(memory_budget_bytes=10_000_000))
    last = s.send("hi", thinking=False).wait(TIMEOUT)
    assert isinstance(last, Failed) and last.code == ev.MEMORY_BUDGET and "GB" in last.message
    assert s.context_tokens == 0


# ---------------------------------------------------------------------------------------------- regenerate / edit
