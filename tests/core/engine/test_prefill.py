"""Reading a prompt (macapp/core/engine/prefill.py): progress, chunks, stop between chunks."""

from __future__ import annotations

from macapp.core.engine import SessionOptions
from macapp.core.events import PromptProgress
from macapp.core.sampling import greedy
from tests.core.engine.helpers import TIMEOUT


def test_progress_events_while_a_long_prompt_is_read(engine):
    s = engine.new_session(options=SessionOptions(prefill_step_size=16))
    job = s.send("word " * 100, thinking=False, sampling=greedy(10))
    progress = [e for e in job.events(timeout=TIMEOUT) if isinstance(e, PromptProgress)]
    total = job.result().stats.prompt_tokens
    assert total > 100
    assert progress[0].processed == 0 and progress[-1].processed == total
    assert all(p.total == total for p in progress)
    assert [p.processed for p in progress] == sorted(p.processed for p in progress)
    assert len(progress) >= total // 16


# ---------------------------------------------------------------------------------------------- bad input
