"""The tiny vision model: mlx-vlm's own classes and processor load it; mlx-lm loads the same folder text-only."""

from __future__ import annotations

import json

import mlx_lm
import pytest
from mlx.utils import tree_flatten
from PIL import Image

from macapp.core.demo.tiny_model import SCRIPT_ANSWER
from macapp.core.demo.tiny_vlm import MAX_PIXELS, VISION_TOKENS


def test_config_and_processor_files_are_real_shaped(tiny_vlm_path):
    config = json.loads((tiny_vlm_path / "config.json").read_text())
    vision = config["vision_config"]
    assert vision["out_hidden_size"] == config["text_config"]["hidden_size"]
    assert {"patch_size", "spatial_merge_size", "temporal_patch_size", "num_position_embeddings"} <= set(vision)
    pre = json.loads((tiny_vlm_path / "preprocessor_config.json").read_text())
    assert pre["image_processor_type"] == "Qwen2VLImageProcessorFast" and pre["processor_class"] == "Qwen3VLProcessor"
    assert pre["patch_size"] == vision["patch_size"] and pre["merge_size"] == vision["spatial_merge_size"]
    index = json.loads((tiny_vlm_path / "model.safetensors.index.json").read_text())
    assert any(k.startswith("vision_tower.") for k in index["weight_map"])
    assert any(k.startswith("language_model.") for k in index["weight_map"])


def test_tokenizer_has_the_vision_tokens_and_the_config_their_ids(tiny_vlm_path):
    _, tokenizer = mlx_lm.load(str(tiny_vlm_path))
    config = json.loads((tiny_vlm_path / "config.json").read_text())
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    assert config["image_token_id"] == ids["<|image_pad|>"] and config["video_token_id"] == ids["<|video_pad|>"]
    assert config["vision_start_token_id"] == ids["<|vision_start|>"] and config["vision_end_token_id"] == ids["<|vision_end|>"]
    assert len(set(ids.values())) == 4 and max(ids.values()) < config["text_config"]["vocab_size"]


def test_mlx_lm_loads_the_same_folder_text_only_and_follows_the_script(tiny_vlm_path):
    model, tokenizer = mlx_lm.load(str(tiny_vlm_path))
    names = [k for k, _ in tree_flatten(model.parameters())]
    assert names and not any("vision" in n or "visual" in n for n in names)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True, enable_thinking=False)
    assert mlx_lm.generate(model, tokenizer, prompt, max_tokens=20) == "".join(SCRIPT_ANSWER)


@pytest.mark.parametrize("fixture", ["tiny_vlm_path", "tiny_vlm_moe_path"])
def test_mlx_vlm_sees_more_image_tokens_for_a_bigger_picture(fixture, request):
    from mlx_vlm import load, stream_generate
    from mlx_vlm.prompt_utils import apply_chat_template

    path = request.getfixturevalue(fixture)
    model, processor = load(str(path))
    prompt = apply_chat_template(processor, model.config, "What is in the picture?", num_images=1, enable_thinking=False)
    assert prompt.count("<|image_pad|>") == 1
    counts = []
    for size in [(64, 64), (192, 128), (2000, 2000)]:
        image = Image.effect_mandelbrot(size, (-2, -1, 1, 1), 30).convert("RGB")
        last = None
        for last in stream_generate(model, processor, prompt, image=[image], max_tokens=3, temperature=0):
            pass
        counts.append(last.prompt_tokens)
    assert counts[0] < counts[1] < counts[2]
    # 64x64 = 4 tokens of 32x32 pixels; 192x128 = 24; the huge one is capped at MAX_PIXELS = 64 tokens
    assert counts[1] - counts[0] == 20 and counts[2] - counts[0] == MAX_PIXELS // 32**2 - 4
