"""Every touchpoint into mlx-lm's and mlx-vlm's internals (macapp/core/upstream.py), each against the installed
library: a test here fails when the internal it leans on moves, before the feature built on it breaks quietly."""

from __future__ import annotations

import json

import mlx.core as mx

from macapp.core import upstream
from tests.fixtures.vision import tiny_vlm_path  # noqa: F401  (a fixture)


def test_text_model_classes_are_mlx_lms_qwen3_5(tiny_dense_path, tiny_moe_path):
    from mlx_lm.models import qwen3_5, qwen3_5_moe

    for path, module in ((tiny_dense_path, qwen3_5), (tiny_moe_path, qwen3_5_moe)):
        config = json.loads((path / "config.json").read_text())
        model_class, args_class = upstream.text_model_classes(config)
        assert (model_class, args_class) == (module.Model, module.ModelArgs)
        assert args_class.from_dict(config).text_config["hidden_size"] == config["text_config"]["hidden_size"]


def test_vlm_model_module_is_mlx_vlms_qwen3_5(tiny_vlm_path):
    from mlx_vlm.models import qwen3_5

    config = json.loads((tiny_vlm_path / "config.json").read_text())
    module = upstream.vlm_model_module(config)
    assert module is qwen3_5
    model_config = module.ModelConfig.from_dict(config)  # what attach_vision builds its model from
    assert isinstance(module.Model(model_config), module.Model)


def test_use_attention_routes_qwen3_5_attention_through_the_given_function(tiny_dense_path):
    from mlx_lm.models import base

    config = json.loads((tiny_dense_path / "config.json").read_text())
    model_class, args_class = upstream.text_model_classes(config)
    model = model_class(args_class.from_dict(config))
    attention_layers = sum(1 for layer in model.layers if not layer.is_linear)
    calls = []

    def counted(queries, keys, values, cache, scale, mask, sinks=None):  # base's arguments, passed on as given
        calls.append(queries.shape)
        return base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    before = upstream.use_attention(counted)
    try:
        assert before is not None
        logits = model(mx.array([[1, 2, 3, 4, 5]]))
        mx.eval(logits)
    finally:
        upstream.use_attention(before)
    assert attention_layers > 0 and len(calls) == attention_layers and logits.shape[:2] == (1, 5)


def test_sampled_not_read_is_the_token_the_batch_generator_reads_next(tiny_dense_path):
    import mlx_lm
    from mlx_lm.generate import BatchGenerator

    model, tokenizer = mlx_lm.load(str(tiny_dense_path))
    gen = BatchGenerator(model, max_tokens=8)
    try:
        (uid,) = gen.insert([tokenizer.encode("hello there")])
        assert upstream.sampled_not_read(gen, uid + 1) is None  # not in the batch
        decoded: list[int] = []
        ahead: list[int | None] = []
        while len(decoded) < 6:
            _prompts, responses = gen.next()
            for response in responses:
                decoded.append(response.token)
                ahead.append(upstream.sampled_not_read(gen, uid))
        assert None not in ahead[:-1]
        assert ahead[:5] == decoded[1:6]  # each read-ahead token is the one the next step hands out
    finally:
        gen.close()


def test_qwen_vl_video_steps_are_mlx_vlms(tiny_vlm_path):
    import numpy as np
    from mlx_vlm.utils import VideoMetadata

    steps = upstream.qwen_vl_video()
    kwargs = steps.video_kwargs(str(tiny_vlm_path), default_patch_size=16)
    assert kwargs["patch_size"] and kwargs["temporal_patch_size"] == 2 and kwargs["merge_size"]
    factor = kwargs["patch_size"] * kwargs["merge_size"]
    height, width = steps.smart_resize(num_frames=4, height=480, width=640, temporal_factor=2, factor=factor, min_pixels=factor**2, max_pixels=factor**2 * 64)
    assert height % factor == 0 and width % factor == 0 and height * width <= factor**2 * 64 and width > height
    frames = np.zeros((1, 3, 48, 64), np.uint8)
    assert steps.resize_frames(frames, height, width).shape == (1, 3, height, width)
    metadata = VideoMetadata(total_num_frames=8, fps=2.0, frames_indices=[0, 2, 4, 6], width=64, height=48, duration=4.0)
    assert steps.group_timestamps(2, 2, 2.0, metadata) == [0.5, 2.5]  # the mean of each pair's source times
    text = steps.timestamped_placeholder([0.5, 2.5], 3, "<s>", "</s>")
    assert text == "<0.5 seconds><s>" + "<|placeholder|>" * 3 + "</s><2.5 seconds><s>" + "<|placeholder|>" * 3 + "</s>"
