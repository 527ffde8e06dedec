"""What a turn may ask for (macapp/core/engine/limits.py): refused before any work, the session untouched."""

from __future__ import annotations

import pytest

from macapp.core import events as ev
from macapp.core.engine import SessionOptions
from macapp.core.engine.limits import context_limit, memory_needed
from macapp.core.engine.options import MTPMode
from macapp.core.events import Failed
from macapp.core.fit import estimate
from macapp.core.sampling import SamplingParams, greedy
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


@pytest.mark.parametrize(
    "kwargs, options, words",
    [
        (dict(sampling=SamplingParams(top_p=0.0)), SessionOptions(), "Bad sampling setting: top_p"),
        (dict(thinking_budget=-1), SessionOptions(), "thinking budget"),
        (dict(), SessionOptions(kv_bits=3), "kv_bits must be 4 or 8"),
    ],
)
def test_bad_settings_are_refused_before_any_work(engine, kwargs, options, words):
    s = engine.new_session(options=options)
    job = s.send("hi", thinking=True, **kwargs)
    events = list(job.events(timeout=TIMEOUT))
    assert len(events) == 1 and isinstance(events[0], Failed) and events[0].code == ev.ERROR and words in events[0].message
    assert s.context_tokens == 0 and s.messages == []


def test_a_refused_redo_of_a_reopened_conversation_loses_nothing(engine):
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "thinking": False}]
    s = engine.new_session(messages=history)
    last = s.regenerate(sampling=SamplingParams(top_p=0.0)).wait(TIMEOUT)
    assert isinstance(last, Failed) and s.messages == history
    tight = engine.new_session(messages=history, options=SessionOptions(context_limit=5))
    assert tight.edit_last("a much longer question than the context allows").wait(TIMEOUT).code == ev.CONTEXT_LIMIT
    assert tight.messages == history
    assert s.regenerate(thinking=False, sampling=greedy(30)).result(timeout=TIMEOUT).text == ANSWER


def test_the_memory_estimate_grows_with_the_context_and_shrinks_with_kv_quantization(engine):
    m = engine.model
    short, long = memory_needed(m, SessionOptions(), 100, 1_000), memory_needed(m, SessionOptions(), 100, 100_000)
    assert m.weights_bytes < short < long
    assert memory_needed(m, SessionOptions(kv_bits=4), 100, 100_000) < long
    assert context_limit(m, SessionOptions(context_limit=64), 10, 20, None) == 64
    assert context_limit(m, SessionOptions(context_limit=10**9), 10, 20, None) == m.info.max_context


def test_the_mtp_heads_own_cache_counts_when_it_may_draft(tiny_mtp, load_tiny):
    m = load_tiny(tiny_mtp("moe", "successor"))
    drafting, plain = memory_needed(m, SessionOptions(), 100, 100_000), memory_needed(m, SessionOptions(mtp=MTPMode.OFF), 100, 100_000)
    one_layer = estimate.kv_cache_bytes(m.arch, 100_000) // m.arch.full_attention_layers
    assert drafting - plain == one_layer * m.mtp_head.depth > 0
    assert memory_needed(m, SessionOptions(kv_bits=4), 100, 100_000) < plain  # a quantized cache: no MTP, no head cache


@pytest.mark.parametrize("head_dim, group", [(64, 64), (32, 32), (96, 32), (128, 64)])
def test_the_kv_group_size_divides_the_head_dimension_so_mlx_can_quantize_it(engine, head_dim, group):
    import dataclasses

    import mlx.core as mx
    from mlx_lm.generate import maybe_quantize_kv_cache
    from mlx_lm.models.cache import KVCache

    from macapp.core.engine.limits import kv_quantization

    m = dataclasses.replace(engine.model, arch=dataclasses.replace(engine.model.arch, head_dim=head_dim))
    kv = kv_quantization(m, SessionOptions(kv_bits=8))
    assert (kv.bits, kv.group_size) == (8, group)
    assert kv_quantization(m, SessionOptions()).bits is None

    def quantized(group_size: int) -> list:
        layer = KVCache()
        layer.update_and_fetch(mx.ones((1, 2, 10, head_dim)), mx.ones((1, 2, 10, head_dim)))
        cache = [layer]
        maybe_quantize_kv_cache(cache, quantized_kv_start=0, kv_group_size=group_size, kv_bits=8)
        mx.eval(cache[0].state)
        return cache

    assert quantized(kv.group_size)[0].bits == 8  # mlx quantizes with the fitted group size
    if head_dim % 64:
        with pytest.raises(ValueError, match="group size"):  # what the default did: a 500 on every request
            quantized(64)


def test_a_head_dimension_no_group_size_divides_is_refused_saying_what_to_do(engine):
    import dataclasses

    from macapp.core.engine import EngineError
    from macapp.core.engine.limits import kv_quantization

    m = dataclasses.replace(engine.model, arch=dataclasses.replace(engine.model.arch, head_dim=48))
    with pytest.raises(EngineError, match="without KV-cache quantization"):
        kv_quantization(m, SessionOptions(kv_bits=4))
