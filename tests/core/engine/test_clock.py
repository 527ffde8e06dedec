"""One clock for live and final statistics (macapp/core/engine/clock.py)."""

from __future__ import annotations

import time

from macapp.core.engine import TurnClock
from macapp.core.events import StatsUpdate
from tests.core.engine.helpers import TIMEOUT, template


def test_stats_fields_are_sane_and_agree_with_a_stopwatch(engine, off_script):
    s = engine.new_session()
    t0 = time.perf_counter()
    job = s.send("count", thinking=True, sampling=off_script.with_overrides(max_tokens=60))
    events = list(job.events(timeout=TIMEOUT))
    wall = time.perf_counter() - t0
    st = job.result().stats
    assert st.finish_reason == "length" and st.generation_tokens == 60 == len(job.result().token_ids)
    assert 0 < st.ttft_s <= st.elapsed_s <= wall
    assert st.prompt_tokens == len(template(engine, [{"role": "user", "content": "count"}], True))
    assert st.prompt_tps > 0 and st.generation_tps > 0
    decode_time = (st.generation_tokens - 1) / st.generation_tps
    assert decode_time <= st.elapsed_s - st.ttft_s + 0.05  # measured from the first token, TTFT excluded
    assert 0 < st.reasoning_tokens <= st.generation_tokens
    assert st.peak_memory_bytes > engine.loaded.weights_bytes
    assert st.context_tokens == s.context_tokens
    live = [e.stats for e in events if isinstance(e, StatsUpdate)]
    assert live and all(u.generation_tokens <= st.generation_tokens for u in live)
    assert live[0].finish_reason is None


def test_live_and_final_figures_come_from_one_clock(engine, off_script):
    job = engine.new_session().send("count", thinking=True, sampling=off_script.with_overrides(max_tokens=60))
    events = list(job.events(timeout=TIMEOUT))
    final = job.result().stats
    live = [e.stats for e in events if isinstance(e, StatsUpdate)]
    assert live and all((u.ttft_s, u.prompt_tokens, u.prompt_tps) == (final.ttft_s, final.prompt_tokens, final.prompt_tps) for u in live)
    assert [u.elapsed_s for u in live] == sorted(u.elapsed_s for u in live) and live[-1].elapsed_s <= final.elapsed_s
    assert all(u.context_tokens == final.context_tokens - final.generation_tokens + u.generation_tokens for u in live)


def test_the_figures_are_computed_from_the_times():
    clock = TurnClock(start=100.0)
    before = clock.stats(last_token_at=0.0, now=100.25, generated=0, reasoning=0, forced=0, context=12, finish=None)
    assert (before.ttft_s, before.prompt_tokens, before.prompt_tps, before.generation_tps) == (0.0, 0, 0.0, 0.0)
    assert before.elapsed_s == 0.25 and before.context_tokens == 12 and before.finish_reason is None
    clock.reading(50)
    clock.prefill_start = 100.5  # as if reading began half a second in
    clock.first_token(101.0)
    st = clock.stats(last_token_at=103.0, now=103.5, generated=21, reasoning=4, forced=3, context=80, finish="length")
    assert (st.ttft_s, st.prompt_tokens, st.prompt_tps) == (1.0, 50, 100.0)
    assert (st.generation_tokens, st.generation_tps, st.reasoning_tokens, st.forced_tokens) == (21, 10.0, 4, 3)
    assert (st.elapsed_s, st.context_tokens, st.finish_reason) == (3.5, 80, "length") and st.peak_memory_bytes >= 0
    one = clock.stats(last_token_at=101.0, now=101.0, generated=1, reasoning=0, forced=0, context=51, finish="stop")
    assert one.generation_tps == 0.0  # one token has no rate
    gone = TurnClock().unanswered(40)
    assert (gone.finish_reason, gone.context_tokens, gone.generation_tokens) == ("stopped", 40, 0) and 0 <= gone.elapsed_s < 1
