"""Prompt checkpoints on a real tiny Qwen3.5 cache (DeltaNet + full attention): restore exactly, evict by bytes."""

from __future__ import annotations

import pytest

from macapp.core.engine.positions import ObservedCache
from macapp.core.engine.prompt_cache import PromptCache
from macapp.core.serving.pool import CheckpointPool, restore, save as snapshot
from macapp.core.vision.spans import PictureSpan

N = 300  # past mlx-lm's 256-token KV step, so the KV buffer grows while checkpoints hold the old one


@pytest.fixture(scope="module")
def lm(tiny_moe_path):
    from mlx_lm import load

    model, tokenizer = load(str(tiny_moe_path))
    return model


@pytest.fixture(scope="module")
def tokens():
    import random

    rng = random.Random(7)
    return [rng.randrange(5, 440) for _ in range(N)]


def read(model, cache, tokens, kv_bits=None):
    """Feed tokens into cache; the logits after the last one."""
    import mlx.core as mx
    from mlx_lm.generate import maybe_quantize_kv_cache

    logits = model(mx.array(tokens)[None], cache=cache)
    if kv_bits:
        maybe_quantize_kv_cache(cache, quantized_kv_start=0, kv_group_size=64, kv_bits=kv_bits)
    mx.eval(logits, [c.state for c in cache])
    return logits[0, -1]


def fresh(model):
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


def same(a, b) -> bool:
    import mlx.core as mx

    return bool(mx.allclose(a, b, atol=1e-4, rtol=1e-4).item())


@pytest.mark.parametrize("kv_bits", [None, 8])
def test_a_restored_checkpoint_reads_on_exactly_like_the_cache_it_was_taken_from(lm, tokens, kv_bits):
    live = fresh(lm)
    read(lm, live, tokens[:120], kv_bits)
    checkpoint = snapshot(live, tokens[:120])
    assert checkpoint.kv.nbytes > 0 and checkpoint.state_bytes > 0
    expected = read(lm, live, tokens[120:], kv_bits)  # the live cache writes on (and its KV buffer grows)
    for _ in range(2):  # restoring twice: the first restore's writes did not reach the checkpoint either
        cache = restore(checkpoint)
        assert same(read(lm, cache, tokens[120:], kv_bits), expected)
    if kv_bits is None:
        assert same(read(lm, fresh(lm), tokens), expected)  # and the same as reading everything afresh


def test_a_checkpoint_is_unchanged_by_more_tokens_in_its_own_buffer(lm, tokens):
    """A KV buffer with room left (offset 10 of 256): the live cache writes into it in place."""
    live = fresh(lm)
    read(lm, live, tokens[:10])
    checkpoint = snapshot(live, tokens[:10])
    read(lm, live, tokens[10:20])
    other = read(lm, live, tokens[20:30])
    a = read(lm, restore(checkpoint), tokens[10:30])
    b = read(lm, fresh(lm), tokens[:30])
    assert same(a, b) and same(a, other)
    assert {getattr(c, "offset", 10) for c in restore(checkpoint)} == {10}


def test_longest_prefix_is_a_proper_prefix_and_refreshes_shorter_ones_last(lm, tokens):
    pool = CheckpointPool(max_bytes=1 << 40)
    cache = fresh(lm)
    for end in (50, 100, 150):
        read(lm, cache, tokens[end - 50 : end])
        pool.add(PromptCache(cache, tokens[:end]))
    other = fresh(lm)
    read(lm, other, tokens[200:240])
    pool.add(PromptCache(other, tokens[200:240]))
    assert pool.lengths == [50, 100, 150, 40]
    assert pool.longest_prefix(tokens[:150]).length == 100  # the same 150 tokens: one must be left to read
    assert pool.longest_prefix(tokens[:151]).length == 150
    assert pool.lengths == [40, 150, 100, 50]  # the other conversation is now the oldest; the system prompt newest
    assert pool.longest_prefix(tokens[1:]) is None
    assert pool.longest_prefix([*tokens[:99], 3]).length == 50
    assert tokens[:100] in pool and pool.add(PromptCache(cache, tokens[:100])).length == 100  # already there: kept, not retaken


def test_the_pool_evicts_least_recently_used_by_bytes(lm, tokens):
    cache = fresh(lm)
    read(lm, cache, tokens[:20])
    taken = snapshot(cache, tokens[:20])
    one = taken.kv.nbytes + taken.state_bytes
    pool = CheckpointPool(max_bytes=int(one * 2.5))
    prompts = [[t + i for t in tokens[:20]] for i in range(3)]
    for prompt in prompts:
        c = fresh(lm)
        read(lm, c, prompt)
        pool.add(PromptCache(c, prompt))
    assert len(pool) == 2 and pool.nbytes <= pool.max_bytes and pool.evicted == 1
    assert prompts[0] not in pool and prompts[1] in pool
    pool.longest_prefix(prompts[1] + [5])  # used: now the newest
    c = fresh(lm)
    read(lm, c, tokens[:20])
    pool.add(PromptCache(c, tokens[:20]))
    assert prompts[1] in pool and prompts[2] not in pool
    tiny = CheckpointPool(max_bytes=one - 1)
    assert tiny.add(PromptCache(cache, tokens[:20])) is None and len(tiny) == 0  # one checkpoint over the whole pool: not kept


def test_bytes_count_the_buffers_a_checkpoint_keeps(lm, tokens):
    from mlx_lm.models.cache import ArraysCache, KVCache

    cache = fresh(lm)
    read(lm, cache, tokens[:10])
    checkpoint = snapshot(cache, tokens[:10])
    kv = sum(c.keys.nbytes + c.values.nbytes for c in cache if isinstance(c, KVCache))
    state = sum(a.nbytes for c in cache if isinstance(c, ArraysCache) for a in c.cache)
    assert (checkpoint.kv.nbytes, checkpoint.state_bytes) == (kv, state) and kv > 0 and state > 0
    with pytest.raises(ValueError, match="not the 11"):
        snapshot(cache, tokens[:11])


def test_one_conversation_keeps_one_kv_buffer_and_every_checkpoint_still_restores(lm, tokens):
    pool = CheckpointPool(max_bytes=1 << 40)
    cache = fresh(lm)
    separate = pos = 0
    for end in (60, 150, 290):
        read(lm, cache, tokens[pos:end])
        pos = end
        taken = pool.add(PromptCache(cache, tokens[:end]))
        separate += taken.kv.nbytes + taken.state_bytes
    assert pool.kv_blocks == 1 and pool.nbytes < separate
    assert pool.nbytes == pool.longest_prefix(tokens).kv.nbytes + sum(pool.longest_prefix(tokens[: n + 1]).state_bytes for n in (60, 150, 290))
    for end in (60, 150, 290):
        checkpoint = pool.longest_prefix(tokens[: end + 1])
        assert checkpoint.length == end
        assert same(read(lm, restore(checkpoint), tokens[end:N]), read(lm, fresh(lm), tokens[:N]))


def test_a_new_owner_clears_the_pool(lm, tokens):
    pool = CheckpointPool(max_bytes=1 << 40)
    cache = fresh(lm)
    read(lm, cache, tokens[:10])
    pool.bind("model a")
    pool.add(PromptCache(cache, tokens[:10]))
    pool.bind("model a")
    assert len(pool) == 1
    pool.bind("model b")
    assert len(pool) == 0 and pool.nbytes == 0


def test_picture_keys_match_only_the_same_picture_and_checkpoints_keep_its_span(lm, tokens):
    """Keys where a picture's tokens are its digest (serving.pictures): a prefix counts only with the same picture."""
    picture = ("image:a",) * 10  # stands for tokens 5..15
    key = (*tokens[:5], *picture, *tokens[15:40])
    pool = CheckpointPool(1 << 30)
    live = fresh(lm)
    read(lm, live, tokens[:20])
    span = PictureSpan(5, 15, None, -6)  # its positions are not read here
    later = PictureSpan(40, 50, None, -6)  # queued for a picture not read yet: no checkpoint keeps it
    pool.add(PromptCache(live, key[:20], [span, later]))
    read(lm, live, tokens[20:40])
    pool.add(PromptCache(live, key, [span, later]))  # the 20-token one now reads this one's KV buffer: its state stays
    kept = (pool.longest_prefix(key[:21]), pool.longest_prefix((*key, 1)))
    assert pool.kv_blocks == 1 and [c.spans for c in kept] == [(span,), (span,)] and [c.rope_delta for c in kept] == [-6, -6]
    restored, _ = pool.resume((*key, 1), lm)
    assert restored.spans == [span]  # a restored cache has its picture back
    assert pool.longest_prefix((*key, 1)).length == 40
    other = (*tokens[:5], *("image:b",) * 10, *tokens[15:40], 1)
    assert pool.longest_prefix(other) is None  # a different picture at token 5: nothing stored before it
    assert pool.longest_prefix((*tokens[:40], 1)) is None  # nor the bare placeholder ids of a text prompt


class Mirrored(ObservedCache):
    """A cache whose checkpoints are mirrored: what a cluster's rank 0 has (macapp.core.cluster.lockstep)."""

    def __init__(self, layers, mirror):
        super().__init__(layers)
        self.mirror = mirror


class Recorder:
    """A CacheMirror that notes what it is told (the lockstep one sends it to the other ranks)."""

    def __init__(self):
        self.told = []

    def saved(self, cache, checkpoint):
        assert isinstance(cache, Mirrored)
        self.told.append(("taken", checkpoint.length))

    def rewound(self, cache, position):  # pragma: no cover - the pool never rewinds
        raise AssertionError("a checkpoint is never rewound into")

    def moved(self, old, onto, moved):
        assert moved.kv is onto.kv and moved.layers is old.layers and moved.tokens == old.tokens
        self.told.append(("moved", old.length, onto.length))

    def restored(self, checkpoint, layers):
        self.told.append(("restored", checkpoint.length))
        return Mirrored(layers, self)


def test_a_mirror_hears_of_every_checkpoint_taken_moved_and_restored(lm, tokens):
    mirror, pool = Recorder(), CheckpointPool(max_bytes=1 << 40)
    cache = Mirrored(fresh(lm), mirror)
    read(lm, cache, tokens[:60])
    pool.add(PromptCache(cache, tokens[:60]))
    read(lm, cache, tokens[60:150])
    pool.add(PromptCache(cache, tokens[:150]))
    pool.add(PromptCache(cache, tokens[:150]))  # already there: nothing taken
    assert mirror.told == [("taken", 60), ("taken", 150), ("moved", 60, 150)]
    restored = restore(pool.longest_prefix(tokens[:100]))
    assert isinstance(restored, Mirrored) and mirror.told[-1] == ("restored", 60)
    assert same(read(lm, restored, tokens[60:N]), read(lm, fresh(lm), tokens[:N]))
    plain = fresh(lm)
    read(lm, plain, tokens[:30])
    assert snapshot(plain, tokens[:30]).mirror is None and len(mirror.told) == 4  # a plain cache is nobody's
