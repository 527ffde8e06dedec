"""Cache snapshots (macapp/core/engine/snapshots.py) on the tiny model's real mlx-lm cache: back to a point, no copies."""

from __future__ import annotations

import pytest
from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache, make_prompt_cache

from macapp.core.engine import KVQuantization, prefill, restore_snapshot, take_snapshot
from macapp.core.engine.snapshots import ArraysState, KVLength
from tests.core.engine.helpers import EXACT, logit_error, on_worker, template

FIRST = [{"role": "user", "content": "the first part of a conversation"}]
MORE = [{"role": "user", "content": "and more words that the snapshot must forget again"}]


def test_restoring_a_snapshot_gives_the_cache_of_that_point_logit_for_logit(engine):
    first, more = template(engine, FIRST, False), template(engine, MORE, False)

    def run(m):
        cache = make_prompt_cache(m.model)
        prefill(m, cache, first, step=8)
        snap = take_snapshot(cache, len(first))
        same = [all(a is b for a, b in zip(layer.arrays, c.cache)) for layer, c in zip(snap.layers, cache) if isinstance(layer, ArraysState)]
        prefill(m, cache, more, step=8)
        moved = [c.offset for c in cache if isinstance(c, KVCache)]
        restore_snapshot(cache, snap)
        return cache, snap, same, moved

    cache, snap, same, moved = on_worker(engine, run)
    assert snap.length == len(first)
    assert {type(layer) for layer, c in zip(snap.layers, cache) if isinstance(c, ArraysCache)} == {ArraysState}
    assert [layer for layer, c in zip(snap.layers, cache) if isinstance(c, KVCache)] == [KVLength(len(first))]
    assert same and all(same)  # references to the DeltaNet states, not copies
    assert snap.nbytes == sum(a.nbytes for layer in snap.layers if isinstance(layer, ArraysState) for a in layer.arrays) > 0
    assert moved == [len(first) + len(more)]
    assert [c.offset for c in cache if isinstance(c, KVCache)] == [len(first)]
    assert logit_error(engine, cache, first) < EXACT
    assert logit_error(engine, cache, first + more) > 100 * EXACT  # the check sees the forgotten tokens


def test_a_snapshot_survives_the_kv_cache_being_quantized_after_it(engine):
    first, more = template(engine, FIRST, False), template(engine, MORE, False)

    def run(m):
        cache = make_prompt_cache(m.model)
        prefill(m, cache, first)
        snap = take_snapshot(cache, len(first))
        prefill(m, cache, more, kv=KVQuantization(bits=8))  # the KV layer becomes a QuantizedKVCache
        quantized = [type(c) for c in cache if c.is_trimmable()]
        restore_snapshot(cache, snap)
        return cache, quantized

    cache, quantized = on_worker(engine, run)
    assert quantized == [QuantizedKVCache]
    assert [c.offset for c in cache if c.is_trimmable()] == [len(first)]


def test_a_snapshot_fits_only_the_cache_it_was_taken_from(engine):
    def run(m):
        cache = make_prompt_cache(m.model)
        snap = take_snapshot(cache, 0)
        with pytest.raises(ValueError):
            restore_snapshot(cache[:-1], snap)
        return len(snap.layers), len(cache)

    layers, cache_layers = on_worker(engine, run)
    assert layers == cache_layers
