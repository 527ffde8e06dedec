"""One clock for live and final statistics (macapp/core/engine/clock.py)."""

from __future__ import annotations

import time

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
