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
