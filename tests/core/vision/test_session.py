"""A ChatSession with pictures, through the real engine, mlx-lm's loop and mlx-vlm's tower on the tiny vision model:
image tokens reach the model (and match mlx-vlm's own generation), follow-ups read only their own tokens, the
stats carry image_tokens, regenerate/edit keep their pictures, and every refusal is clear and changes nothing."""

from __future__ import annotations

import pytest

from macapp.core import events as ev
from macapp.core.engine import Engine, EngineError, SessionOptions
from macapp.core.sampling import greedy
from macapp.core.vision.images import open_image
from tests.core.engine.helpers import TIMEOUT, kv_offsets

THINK = False


def _reference(path, prompt_text, pictures, bias, n):
    """mlx-vlm's own load + generate on the same text prompt and pictures: its first `n` greedy tokens."""
    from mlx_vlm import load, stream_generate

    model, processor = load(str(path))
    return [  # (mlx-vlm's stream yields one token past max_tokens)
        r.token for r in stream_generate(model, processor, prompt_text, image=[p.image for p in pictures], max_tokens=n, temperature=0, logit_bias=bias)
    ][:n]


def test_a_picture_reaches_the_model_like_mlx_vlms_own_generate(engine, tiny_vlm_path, picture, long_reply):
    path = picture("scene.png", (96, 64))
    reply = engine.new_session().send("What is in this picture?", thinking=THINK, sampling=long_reply, images=[path]).result(timeout=TIMEOUT)
    assert reply.stats.image_tokens == 6  # 96x64 pixels in 32x32-pixel tokens
    assert reply.stats.prompt_tokens > reply.stats.image_tokens and reply.stats.prompt_tps > 0
    tokenizer = engine.model.tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]}],
        add_generation_prompt=True,
        enable_thinking=THINK,
        tokenize=False,
    )
    assert len(reply.token_ids) >= 20
    assert reply.token_ids == _reference(tiny_vlm_path, text, [open_image(path)], long_reply.logit_bias, len(reply.token_ids))
    plain = engine.new_session().send("What is in this picture?", thinking=THINK, sampling=long_reply).result(timeout=TIMEOUT)
    assert plain.token_ids != reply.token_ids and plain.stats.image_tokens == 0


def test_a_bigger_picture_gives_more_image_tokens(engine, picture):
    small = engine.new_session().send("describe", thinking=THINK, sampling=greedy(4), images=[picture("s.png", (64, 64))]).result(timeout=TIMEOUT)
    big = engine.new_session().send("describe", thinking=THINK, sampling=greedy(4), images=[picture("b.png", (192, 128))]).result(timeout=TIMEOUT)
    two = (
        engine.new_session()
        .send("compare", thinking=THINK, sampling=greedy(4), images=[picture("s.png", (64, 64)), picture("b.png", (192, 128))])
        .result(timeout=TIMEOUT)
    )
    assert (small.stats.image_tokens, big.stats.image_tokens, two.stats.image_tokens) == (4, 24, 28)
    assert big.stats.prompt_tokens - small.stats.prompt_tokens == 20


def test_the_time_to_first_token_includes_encoding_the_picture(engine, picture, monkeypatch):
    """The tower's run is part of the wait for the first token (not hidden before the clock starts); prompt tok/s
    times the reading of the prompt, its image tokens included."""
    import time

    from macapp.core.engine import pictures as engine_pictures
    from tests.core.engine.helpers import on_worker

    vision = on_worker(engine, engine_pictures.vision_for)
    real = vision.encode
    delay = 0.5

    def slower_encode(*args, **kwargs):  # the real encoder, plus a known pause inside it
        time.sleep(delay)
        return real(*args, **kwargs)

    monkeypatch.setattr(vision, "encode", slower_encode)
    stats = engine.new_session().send("describe", thinking=THINK, sampling=greedy(4), images=[picture("t.png", (64, 64))]).result(timeout=TIMEOUT).stats
    assert stats.image_tokens == 4 and stats.ttft_s >= delay
    assert stats.prompt_tokens / stats.prompt_tps <= stats.ttft_s - delay  # the reading, after the encoding


def test_a_follow_up_reads_only_its_own_tokens_and_matches_a_full_reread(engine, picture, long_reply):
    path = picture("page.png", (128, 96))
    s = engine.new_session()
    first = s.send("Read this page.", thinking=THINK, sampling=long_reply, images=[path]).result(timeout=TIMEOUT)
    follow = s.send("And the title?", thinking=THINK, sampling=long_reply).result(timeout=TIMEOUT)
    assert follow.stats.image_tokens == 0  # the picture is not encoded again
    closing = len(engine.model.tokenizer.encode("<|im_end|>\n", add_special_tokens=False))
    new_turn = engine.model.tokenizer.apply_chat_template([{"role": "user", "content": "And the title?"}], add_generation_prompt=True, enable_thinking=THINK)
    assert follow.stats.prompt_tokens == closing + len(new_turn)  # nor the conversation re-read
    assert kv_offsets(s) == [s.context_tokens]
    # a reopened conversation with the picture, read once as the session held it, is the same cache: the same answer
    messages = s.messages[:2]
    assert messages[0]["images"][0].name.endswith("page.png")
    reopened = engine.new_session(messages=messages)
    again = reopened.send("And the title?", thinking=THINK, sampling=long_reply).result(timeout=TIMEOUT)
    assert again.stats.image_tokens == first.stats.image_tokens
    assert again.token_ids == follow.token_ids and reopened.tokens == s.tokens


def test_text_first_then_a_picture_on_the_same_cache(engine, picture):
    s = engine.new_session()
    s.send("hello", thinking=THINK, sampling=greedy(8)).result(timeout=TIMEOUT)
    before = s.context_tokens
    reply = s.send("now look at this", thinking=THINK, sampling=greedy(8), images=[picture("x.png", (64, 64))]).result(timeout=TIMEOUT)
    tokenizer = engine.model.tokenizer
    turn = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "now look at this"}]}], add_generation_prompt=True, enable_thinking=THINK
    )
    closing = s.messages[1]["finish_reason"] == "stop"  # the model wrote <|im_end|>: "\n" closes it
    assert closing and reply.stats.image_tokens == 4
    assert reply.stats.prompt_tokens == 1 + len(turn) - 1 + 4  # only the new turn: its one placeholder widened to 4
    assert s.context_tokens == before + reply.stats.prompt_tokens + reply.stats.generation_tokens


def test_regenerate_and_edit_keep_the_picture(engine, picture, long_reply):
    s = engine.new_session()
    first = s.send("What is it?", thinking=THINK, sampling=long_reply, images=[picture("r.png", (96, 96))]).result(timeout=TIMEOUT)
    again = s.regenerate(sampling=long_reply).result(timeout=TIMEOUT)
    assert again.stats.prompt_tokens == 1 and again.token_ids == first.token_ids  # same position, same picture
    edited = s.edit_last("What colour is it?", sampling=long_reply).result(timeout=TIMEOUT)
    assert edited.stats.image_tokens == 9 and s.messages[-2]["images"]
    fresh = engine.new_session().send("What colour is it?", thinking=THINK, sampling=long_reply, images=[picture("r.png", (96, 96))]).result(timeout=TIMEOUT)
    assert edited.token_ids == fresh.token_ids


def test_a_bad_picture_is_refused_by_name_and_nothing_changes(engine, tmp_path):
    s = engine.new_session()
    s.send("hi", thinking=THINK, sampling=greedy(4)).result(timeout=TIMEOUT)
    before = (s.messages, s.context_tokens)
    (tmp_path / "notes.png").write_text("not a picture")
    for bad, words in [(tmp_path / "gone.png", "no such file"), (tmp_path / "notes.png", "is not a picture")]:
        with pytest.raises(EngineError) as info:
            s.send("look", thinking=THINK, images=[bad]).result(timeout=TIMEOUT)
        assert info.value.code == ev.BAD_IMAGE and bad.name in str(info.value) and words in str(info.value)
    assert (s.messages, s.context_tokens) == before
    assert s.send("still here?", thinking=THINK, sampling=greedy(4)).result(timeout=TIMEOUT).finish_reason in ("stop", "length")


def test_too_many_pictures_for_the_context(engine, picture):
    s = engine.new_session(options=SessionOptions(context_limit=100))
    with pytest.raises(EngineError) as info:
        s.send("all of these", thinking=THINK, images=[picture("a.png", (256, 256)), picture("b.png", (256, 256))]).result(timeout=TIMEOUT)
    assert info.value.code == ev.CONTEXT_LIMIT and "Too many pictures" in str(info.value) and "a.png: 64" in str(info.value)
    assert s.messages == [] and s.context_tokens == 0


def test_a_text_only_build_refuses_pictures(tiny_dense_path, picture):
    e = Engine()
    e.load(str(tiny_dense_path)).result(timeout=TIMEOUT)
    try:
        s = e.new_session()
        with pytest.raises(EngineError) as info:
            s.send("look", thinking=THINK, images=[picture()]).result(timeout=TIMEOUT)
        assert info.value.code == ev.TEXT_ONLY and "this build is text-only: use mlx-community/Qwen3.5-0.8B-4bit" in str(info.value)
        assert s.messages == []
        assert s.send("fine, words then", thinking=THINK, sampling=greedy(4)).result(timeout=TIMEOUT).stats.image_tokens == 0
    finally:
        e.close()


def test_thinking_with_a_picture_streams_reasoning_then_answer(engine, picture):
    reply = engine.new_session().send("hello", thinking=True, sampling=greedy(60), images=[picture("t.png", (64, 64))]).result(timeout=TIMEOUT)
    assert reply.thinking and reply.stats.image_tokens == 4 and reply.stats.reasoning_tokens > 0
    assert "</think>" not in reply.text + reply.reasoning


def test_stop_while_the_picture_turn_is_read_undoes_it(engine, picture, long_reply):
    import threading

    from macapp.core.events import PromptProgress

    s = engine.new_session(options=SessionOptions(prefill_step_size=8))
    s.send("hi", thinking=THINK, sampling=greedy(8)).result(timeout=TIMEOUT)
    before_tokens, before_messages = list(s.tokens), s.messages
    job = s.send("look " * 100, thinking=THINK, sampling=greedy(8), images=[picture("big.png", (256, 256))])
    reading = threading.Event()
    job.add_listener(lambda e: reading.set() if isinstance(e, PromptProgress) and e.processed > 0 else None)
    assert reading.wait(TIMEOUT)
    job.stop()
    reply = job.result(timeout=TIMEOUT)
    assert reply.finish_reason == "stopped" and not reply.kept
    job.join(TIMEOUT)
    assert s.tokens == before_tokens and s.messages == before_messages
    again = s.send("and now?", thinking=THINK, sampling=long_reply, images=[picture("small.png", (64, 64))]).result(timeout=TIMEOUT)
    assert again.stats.image_tokens == 4 and kv_offsets(s) == [s.context_tokens]
    fresh = engine.new_session()  # the undone picture left nothing behind: positions and cache as if never sent
    fresh.send("hi", thinking=THINK, sampling=greedy(8)).result(timeout=TIMEOUT)
    same = fresh.send("and now?", thinking=THINK, sampling=long_reply, images=[picture("small.png", (64, 64))]).result(timeout=TIMEOUT)
    assert again.token_ids == same.token_ids


def test_a_quantized_kv_cache_takes_pictures_too(engine, picture, long_reply):
    from mlx_lm.models.cache import QuantizedKVCache

    s = engine.new_session(options=SessionOptions(kv_bits=8))
    first = s.send("What is it?", thinking=THINK, sampling=long_reply, images=[picture("q.png", (96, 96))]).result(timeout=TIMEOUT)
    follow = s.send("more?", thinking=THINK, sampling=long_reply).result(timeout=TIMEOUT)
    assert isinstance(s.cache[-1], QuantizedKVCache) and first.stats.image_tokens == 9
    again = s.regenerate(sampling=long_reply).result(timeout=TIMEOUT)
    assert again.stats.prompt_tokens == 1 and again.token_ids == follow.token_ids
    assert kv_offsets(s) == [s.context_tokens]


def test_the_memory_budget_counts_the_tower_once_it_is_attached(engine, picture):
    from macapp.core.engine.pictures import attached_bytes

    s = engine.new_session()
    s.send("x", thinking=THINK, sampling=greedy(2), images=[picture("m.png", (64, 64))]).result(timeout=TIMEOUT)
    tower = attached_bytes(engine.model)
    assert tower > 0
    from macapp.core.engine.limits import memory_needed

    need = memory_needed(engine.model, SessionOptions(), 20, s.context_tokens + 20)
    tight = engine.new_session(options=SessionOptions(memory_budget_bytes=need + tower // 2))  # enough without the tower
    with pytest.raises(EngineError) as info:
        tight.send("y" * 1, thinking=THINK, sampling=greedy(2)).result(timeout=TIMEOUT)
    assert info.value.code == ev.MEMORY_BUDGET


def test_pictures_on_several_macs_are_refused_clearly(engine):
    import dataclasses

    import mlx.core as mx

    from macapp.core.cluster.lockstep import LockstepModel
    from macapp.core.engine.pictures import vision_for
    from tests.core.engine.helpers import on_worker

    def attach_on_a_cluster(m):
        shared = dataclasses.replace(m, model=LockstepModel(m.model, mx.distributed.init()))  # a group of one rank
        with pytest.raises(EngineError, match="not supported on several Macs yet"):
            vision_for(shared)
        return True

    assert on_worker(engine, attach_on_a_cluster)


def _full_attention_keys(session):
    """The keys of the session's full-attention layers (rotary positions are in them), read on the worker."""
    import mlx.core as mx
    import numpy as np

    from tests.core.engine.helpers import on_worker

    def read(_m):
        layers = [c for c in session.cache if c.is_trimmable()]
        return [np.array(c.keys[..., : c.offset, :].astype(mx.float32)) for c in layers]

    return on_worker(session.engine, read)


def test_a_picture_turn_beside_a_long_api_reply_decodes_in_the_batch_at_its_own_positions(engine, picture, long_reply):
    """A turn with a picture is read alone (the tower's features), then decodes in mlx-lm's batch beside a long API
    reply, its rotary positions moved by the picture's delta (core/upstream.py shifted_layers): the same reply and
    the same cache, keys and all, as the turn alone; the follow-up after it (alone again) too."""
    import threading

    from macapp.core.events import AnswerDelta
    from macapp.core.serving.requests import ChatMessage, CompletionRequest, Role
    from macapp.core.serving.runner import ServingEngine, ServingOptions

    path = picture("beside.png", (128, 96))

    batch = engine.batch_loop()
    decoding_beside: list[int] = []  # sequences in the loop while the turn's reply streamed

    def conversation(s):
        job = s.send("What is in this picture?", thinking=THINK, sampling=long_reply, images=[path])
        job.add_listener(lambda e: decoding_beside.append(batch.active) if isinstance(e, AnswerDelta) else None)
        return job.result(timeout=TIMEOUT)

    first = engine.new_session()
    alone = conversation(first)
    alone_keys = _full_attention_keys(first)
    decoding_beside.clear()
    serving = ServingEngine(engine, ServingOptions(pool_bytes=0))
    vocab = engine.model.tokenizer.get_vocab()
    endless = greedy(100_000, logit_bias={vocab["<|im_end|>"]: -1e9, vocab["<|endoftext|>"]: -1e9})
    long = serving.submit(CompletionRequest(messages=(ChatMessage(Role.USER, "Tell me a long story."),), sampling=endless, thinking=False))
    streaming = threading.Event()
    long.add_listener(lambda e: streaming.set() if isinstance(e, AnswerDelta) else None)
    assert streaming.wait(TIMEOUT)
    second = engine.new_session()
    try:
        beside = conversation(second)
        assert max(decoding_beside) >= 2  # its reply decoded in mlx-lm's batch, beside the long one
    finally:
        long.stop()
        long.wait(TIMEOUT)
        serving.close()
    beside_keys = _full_attention_keys(second)  # a job of the worker: after the long reply (the batch finishes first)
    assert beside.token_ids == alone.token_ids and beside.stats.image_tokens == alone.stats.image_tokens
    assert len(beside_keys) == len(alone_keys) > 0
    for got, want in zip(beside_keys, alone_keys):
        assert got.shape == want.shape and abs(got - want).max() < 1e-4
