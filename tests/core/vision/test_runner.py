"""The mlx-vlm runner on the real tiny model: pictures reach the model (image tokens), positions and logits match
mlx-vlm's own forward pass, a follow-up reads only its own tokens, and the text weights are shared, not copied."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten

from macapp.core.vision.images import image_from_bytes
from macapp.core.vision.runner import attach_vision, cache_length
from tests.fixtures.vision import picture_bytes


@pytest.fixture(scope="module")
def loaded(tiny_vlm_path):
    model, tokenizer = mlx_lm.load(str(tiny_vlm_path))
    before = mx.get_active_memory()
    vision = attach_vision(model, tiny_vlm_path)
    return model, tokenizer, vision, mx.get_active_memory() - before


def _image_turn(tokenizer, text="What is this?", n=1, thinking=False):
    content = [{"type": "image"}] * n + [{"type": "text", "text": text}]
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, enable_thinking=thinking, tokenize=False)


def _tokens(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def _picture(size, seed=0):
    return image_from_bytes(picture_bytes(size, seed=seed), f"p{size[0]}x{size[1]}.png")


def test_attaching_costs_the_tower_not_a_second_copy_of_the_weights(loaded, tiny_vlm_path):
    model, _, vision, grew = loaded
    from macapp.core.vision.capability import folder_support

    assert vision.vision_bytes == folder_support(tiny_vlm_path).tower_bytes
    text_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    assert grew < vision.vision_bytes + text_bytes // 2
    assert vision.model.language_model.model.embed_tokens.weight is not None


def test_before_any_picture_the_positioned_model_is_mlx_lms(loaded):
    model, tokenizer, vision, _ = loaded
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hello there"}], add_generation_prompt=True, enable_thinking=False)
    vision.lm.bind([])
    ours = vision.lm(mx.array([ids]), cache=vision.lm.make_cache())
    assert mx.abs(ours - model(mx.array([ids]))).max().item() < 1e-4


def test_bigger_pictures_give_more_image_tokens_and_the_estimate_matches(loaded):
    _, tokenizer, vision, _ = loaded
    text = _image_turn(tokenizer)
    counts = []
    for size in [(64, 64), (192, 128), (3000, 3000)]:
        image = _picture(size)
        turn = vision.encode(_tokens(tokenizer, text), [image])
        assert turn.image_tokens == vision.image_token_count(image)
        counts.append(turn.image_tokens)
    assert counts == [4, 24, 64]
    two = vision.encode(_tokens(tokenizer, _image_turn(tokenizer, n=2)), [_picture((64, 64)), _picture((192, 128))])
    assert two.image_tokens == 28


def test_an_image_turn_matches_mlx_vlms_own_forward_pass(loaded, tiny_vlm_path):
    _, tokenizer, vision, _ = loaded
    image = _picture((160, 96))
    text = _image_turn(tokenizer)
    turn = vision.encode(_tokens(tokenizer, text), [image])
    assert turn.delta < 0  # image tokens take compact 2-D positions
    cache = vision.lm.make_cache()
    vision.lm.bind([])
    vision.lm.queue(turn, cache)
    ours = vision.lm(mx.array([turn.tokens]), cache=cache, input_embeddings=turn.embeddings[None])[0, -1]

    inputs = vision.processor(text=[text], images=[image.image], padding=False, return_tensors="mlx")
    reference = vision.model(mx.array(inputs["input_ids"]), mx.array(inputs["pixel_values"]), image_grid_thw=mx.array(inputs["image_grid_thw"])).logits[0, -1]
    assert mx.abs(ours - reference).max().item() < 1e-4
    # and the picture matters: another picture, other logits
    other = vision.encode(_tokens(tokenizer, text), [_picture((160, 96), seed=7)])
    c2 = vision.lm.make_cache()
    vision.lm.bind([])
    vision.lm.queue(other, c2)
    theirs = vision.lm(mx.array([other.tokens]), cache=c2, input_embeddings=other.embeddings[None])[0, -1]
    assert mx.abs(theirs - ours).max().item() > 1e-3


def test_stream_generate_drives_it_and_a_follow_up_reads_only_its_own_tokens(loaded):
    _, tokenizer, vision, _ = loaded
    image = _picture((128, 128))
    text = _image_turn(tokenizer)
    turn = vision.encode(_tokens(tokenizer, text), [image])
    cache = vision.lm.make_cache()
    vision.lm.bind([])
    vision.lm.queue(turn, cache)
    reply = [
        r.token
        for r in mlx_lm.stream_generate(vision.lm, tokenizer, mx.array(turn.tokens), max_tokens=10, prompt_cache=cache, input_embeddings=turn.embeddings)
    ]
    assert reply[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert cache_length(cache) == len(turn.tokens) + len(reply)  # mlx-lm reads each token as it yields it
    follow = tokenizer.encode("\n", add_special_tokens=False) + tokenizer.apply_chat_template(
        [{"role": "user", "content": "And its colour?"}], add_generation_prompt=True, enable_thinking=False
    )
    read = []
    next_reply = [
        r.token
        for r in mlx_lm.stream_generate(
            vision.lm, tokenizer, mx.array(follow), max_tokens=1, prompt_cache=cache, prompt_progress_callback=lambda done, total: read.append(total)
        )
    ]
    assert read[-1] == len(follow)  # only the new turn: the picture is not encoded or read again
    # the same conversation read from scratch by mlx-vlm gives the same next token distribution
    full = turn.tokens + reply + follow
    inputs = vision.processor(text=[text], images=[image.image], padding=False, return_tensors="mlx")
    feats = vision.model.get_input_embeddings(mx.array([full]), mx.array(inputs["pixel_values"]), image_grid_thw=mx.array(inputs["image_grid_thw"]))
    lm = vision.model.language_model
    reference = lm(mx.array([full]), inputs_embeds=feats.inputs_embeds, cache=lm.make_cache(), position_ids=feats.position_ids).logits[0, -1]
    assert next_reply[0] == int(mx.argmax(reference).item())


def test_positions_after_a_picture_and_after_a_restore(loaded):
    _, tokenizer, vision, _ = loaded
    turn = vision.encode(_tokens(tokenizer, _image_turn(tokenizer)), [_picture((128, 128))])
    cache = vision.lm.make_cache()
    spans: list = []
    vision.lm.bind(spans)
    vision.lm.queue(turn, cache)
    vision.lm(mx.array([turn.tokens[:-1]]), cache=cache, input_embeddings=turn.embeddings[None, :-1])
    n = len(turn.tokens)
    # the prompt's last token (fed again by a regenerate) keeps the turn's own position
    assert vision.lm.positions(n - 1, 1).tolist() == turn.positions[:, :, -1:].tolist()
    # text after the turn continues from its last position, not from the token count
    after = vision.lm.positions(n, 3)[0, 0].tolist()
    last = int(turn.positions.max().item())
    assert after == [last + 1, last + 2, last + 3] and last + 1 < n
    vision.lm.forget_after(n - 1)  # a regenerate's restore keeps the turn
    assert len(spans) == 1
    vision.lm.forget_after(0)  # an edit's restore to before the turn forgets it
    assert spans == [] and vision.lm.positions(n, 1)[0, 0].tolist() == [n]


def test_the_session_cache_stays_mlx_lms_own(loaded):
    from mlx_lm.models.cache import ArraysCache, KVCache

    _, _, vision, _ = loaded
    assert [type(c) for c in vision.lm.make_cache()] == [ArraysCache, ArraysCache, ArraysCache, KVCache]
