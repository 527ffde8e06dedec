"""Saved positions (macapp/core/engine/positions.py) on the tiny models' real mlx-lm caches: marks go back to a point
without copies; detached positions restore into fresh caches and go through plain arrays and a JSON header and
continue token for token as the in-memory ones (dense, MoE, with the MTP head)."""

from __future__ import annotations

import pytest
from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache, make_prompt_cache

from macapp.core.engine import KVQuantization, prefill
from macapp.core.engine.positions import KVLayer, RecurrentState
from macapp.core.engine.positions import mark
from macapp.core.engine.positions import rewind
from tests.core.engine.helpers import EXACT, logit_error, on_worker, template

FIRST = [{"role": "user", "content": "the first part of a conversation"}]
MORE = [{"role": "user", "content": "and more words that the snapshot must forget again"}]


def test_restoring_a_snapshot_gives_the_cache_of_that_point_logit_for_logit(engine):
    first, more = template(engine, FIRST, False), template(engine, MORE, False)

    def run(m):
        cache = make_prompt_cache(m.model)
        prefill(m, cache, first, step=8)
        snap = mark(cache, len(first))
        same = [all(a is b for a, b in zip(layer.arrays, c.cache)) for layer, c in zip(snap.layers, cache) if isinstance(layer, RecurrentState)]
        prefill(m, cache, more, step=8)
        moved = [c.offset for c in cache if isinstance(c, KVCache)]
        rewind(cache, snap)
        return cache, snap, same, moved

    cache, snap, same, moved = on_worker(engine, run)
    assert snap.length == len(first)
    assert {type(layer) for layer, c in zip(snap.layers, cache) if isinstance(c, ArraysCache)} == {RecurrentState}
    assert [layer for layer, c in zip(snap.layers, cache) if isinstance(c, KVCache)] == [KVLayer(len(first))]
    assert same and all(same)  # references to the DeltaNet states, not copies
    assert snap.state_bytes == sum(a.nbytes for layer in snap.layers if isinstance(layer, RecurrentState) for a in layer.arrays) > 0
    assert moved == [len(first) + len(more)]
    assert [c.offset for c in cache if isinstance(c, KVCache)] == [len(first)]
    assert logit_error(engine, cache, first) < EXACT
    assert logit_error(engine, cache, first + more) > 100 * EXACT  # the check sees the forgotten tokens


def test_a_snapshot_survives_the_kv_cache_being_quantized_after_it(engine):
    first, more = template(engine, FIRST, False), template(engine, MORE, False)

    def run(m):
        cache = make_prompt_cache(m.model)
        prefill(m, cache, first)
        snap = mark(cache, len(first))
        prefill(m, cache, more, kv=KVQuantization(bits=8))  # the KV layer becomes a QuantizedKVCache
        quantized = [type(c) for c in cache if c.is_trimmable()]
        rewind(cache, snap)
        return cache, quantized

    cache, quantized = on_worker(engine, run)
    assert quantized == [QuantizedKVCache]
    assert [c.offset for c in cache if c.is_trimmable()] == [len(first)]


def test_a_snapshot_fits_only_the_cache_it_was_taken_from(engine):
    def run(m):
        cache = make_prompt_cache(m.model)
        snap = mark(cache, 0)
        with pytest.raises(ValueError):
            rewind(cache[:-1], snap)
        return len(snap.layers), len(cache)

    layers, cache_layers = on_worker(engine, run)
    assert layers == cache_layers


# -- detached positions through plain arrays -------------------------------------------------------------------


def _continue(m, prompt, last, mtp: bool):
    """Greedy reply from `prompt` (holding all but the prompt's `last` token): its tokens, MTP counts, head context."""
    from macapp.core.engine.clock import TurnClock
    from macapp.core.engine.mtp_policy import DepthPolicy
    from macapp.core.engine.options import MTPMode
    from tests.core.engine.helpers import stream_alone
    from macapp.core.sampling import greedy

    context = prompt.head_context(m.mtp_head) if mtp else None
    streamed = stream_alone(
        m,
        prompt.layers,
        [last],
        held=prompt.tokens,
        limit=4096,
        params=greedy(24),
        thinking=False,
        emit=lambda _event: None,
        clock=TurnClock(),
        kv=KVQuantization(),
        mtp=MTPMode.ON if mtp else MTPMode.OFF,
        mtp_policy=DepthPolicy(MTPMode.ON) if mtp else None,
        mtp_context=context,
    )
    stats = streamed.reply.stats
    return streamed.reply.token_ids, (stats.mtp_steps, stats.mtp_accepted)


def _through_disk(position, tmp_path):
    """`position` written as safetensors + a JSON header and read back (what the disk store does)."""
    import json

    import mlx.core as mx

    from macapp.core.engine.positions import SavedPosition

    arrays, header = position.to_arrays()
    mx.save_safetensors(str(tmp_path / "position.safetensors"), arrays)
    (tmp_path / "position.json").write_text(json.dumps(header))
    return SavedPosition.from_arrays(mx.load(str(tmp_path / "position.safetensors")), json.loads((tmp_path / "position.json").read_text()))


@pytest.mark.parametrize(
    "build, kv_bits",
    [("dense", None), ("moe", None), ("moe", 8), ("mtp", None)],
)
def test_a_position_through_plain_arrays_continues_token_for_token_as_the_one_in_memory(build, kv_bits, request, load_tiny, tmp_path):
    from macapp.core.engine.prompt_cache import PromptCache

    path = request.getfixturevalue("tiny_mtp")("moe", "successor") if build == "mtp" else request.getfixturevalue(f"tiny_{build}_path")
    m = load_tiny(path)
    mtp = build == "mtp"
    messages = [{"role": "user", "content": "Tell me a long story about the sea, the wind and a small boat"}]
    tokens = list(m.tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False))
    prompt = PromptCache.new(m)
    context = prompt.head_context(m.mtp_head) if mtp else None
    prefill(m, prompt.layers, tokens[:-1], step=8, kv=KVQuantization(bits=kv_bits), head=context, held=0)
    prompt.extend(tokens[:-1])
    position = prompt.save()
    assert position.detached and (position.head is not None) == mtp
    assert {buf.quantization for buf in position.kv.layers} == {(64, kv_bits) if kv_bits else None}

    again = _through_disk(position, tmp_path)
    assert again.tokens == tuple(tokens[:-1]) and again.length == position.length
    assert [type(a) for a in again.layers] == [type(a) for a in position.layers]
    assert again.state_bytes == position.state_bytes > 0

    in_memory = _continue(m, PromptCache.restore(position), tokens[-1], mtp)
    from_disk = _continue(m, PromptCache.restore(again), tokens[-1], mtp)
    assert from_disk == in_memory
    fresh = PromptCache.new(m)
    prefill(m, fresh.layers, tokens[:-1], step=8, kv=KVQuantization(bits=kv_bits))
    fresh.extend(tokens[:-1])
    assert in_memory[0] == _continue(m, fresh, tokens[-1], False)[0]  # and both as a fresh read
    if mtp:  # the head's layers came back: the drafts were taken from its context, not a fresh one
        assert in_memory[1][1] > 0
        restored = PromptCache.restore(again).head_context(m.mtp_head)
        assert (restored.base, restored.end, restored.carry[0]) == (0, len(tokens) - 2, len(tokens) - 2)


def test_a_mark_or_a_damaged_file_is_refused_with_what_is_wrong(engine, tmp_path):
    import mlx.core as mx

    from macapp.core.engine.positions import SavedPosition
    from macapp.core.vision.spans import PictureSpan

    def run(m):
        cache = make_prompt_cache(m.model)
        first = template(engine, FIRST, False)
        prefill(m, cache, first)
        with pytest.raises(ValueError, match="mark"):
            mark(cache, len(first)).to_arrays()
        from macapp.core.engine.positions import save

        span = PictureSpan(2, 6, mx.array([[[2, 3, 3, 3]]] * 3), -1, 2)
        return save(cache, first, [span])

    position = on_worker(engine, run)
    arrays, header = position.to_arrays()
    again = SavedPosition.from_arrays(arrays, header)
    (span,) = again.spans
    assert (span.start, span.end, span.delta, span.base) == (2, 6, -1, 2) and again.rope_delta == -1
    assert mx.array_equal(span.positions, position.spans[0].positions)
    missing = {k: v for k, v in arrays.items() if not k.startswith("kv.0.values")}
    with pytest.raises(ValueError, match="kv.0.values"):
        SavedPosition.from_arrays(missing, header)
    with pytest.raises(ValueError, match="version"):
        SavedPosition.from_arrays(arrays, {**header, "version": 99})
