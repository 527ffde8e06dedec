"""Reading a prompt (macapp/core/engine/prefill.py): progress, chunks, stop between chunks."""

from __future__ import annotations

from mlx_lm.models.cache import make_prompt_cache

from macapp.core.engine import SessionOptions, prefill
from macapp.core.events import PromptProgress
from macapp.core.sampling import greedy
from tests.core.engine.helpers import EXACT, TIMEOUT, logit_error, on_worker, template


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


def test_prefill_in_chunks_is_the_one_shot_state_and_reports_each_chunk(engine):
    tokens = template(engine, [{"role": "user", "content": "word " * 30}], False)
    seen = []

    def run(m):
        cache = make_prompt_cache(m.model)
        return cache, prefill(m, cache, tokens, step=5, on_progress=seen.append)

    cache, read = on_worker(engine, run)
    assert read == len(tokens) and seen == [*range(5, len(tokens), 5), len(tokens)]
    assert [c.offset for c in cache if c.is_trimmable()] == [len(tokens)]
    assert logit_error(engine, cache, tokens) < EXACT


def test_a_stop_is_seen_between_chunks(engine):
    tokens = template(engine, [{"role": "user", "content": "word " * 30}], False)
    seen = []

    def run(m):
        at_once, after_one = make_prompt_cache(m.model), make_prompt_cache(m.model)
        none = prefill(m, at_once, tokens, step=5, should_stop=lambda: True)
        one = prefill(m, after_one, tokens, step=5, should_stop=lambda: bool(seen), on_progress=seen.append)
        return none, one, at_once, after_one

    none, one, at_once, after_one = on_worker(engine, run)
    assert none == 0 and at_once[0].empty() and [c.offset for c in at_once if c.is_trimmable()] == [0]
    assert one == 5 and seen == [5] and [c.offset for c in after_one if c.is_trimmable()] == [5]
    assert logit_error(engine, after_one, tokens[:5]) < EXACT
