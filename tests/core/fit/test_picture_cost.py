"""What pictures cost in memory (macapp.core.fit.picture_cost): the tower's bytes from vision_config match the real tensors; activations grow with the picture."""

from __future__ import annotations

import json
from pathlib import Path

from macapp.core.fit import picture_cost as cost
from macapp.core.vision import capability
from tests.fixtures.vision import tiny_vlm_path  # noqa: F401  (fixture)

REFERENCE = Path(__file__).parents[1] / "recorded"  # copies of the published configs (shared/reference/configs)


def test_computed_tower_bytes_equal_the_files(tiny_vlm_path):
    config = json.loads((tiny_vlm_path / "config.json").read_text())
    exact = capability.folder_support(tiny_vlm_path).tower_bytes
    assert cost.checkpoint_dtype_bytes(config) == 4  # the tiny model is float32
    assert cost.tower_bytes_from_config(config["vision_config"], 4) == exact
    computed = cost.vision_cost(config)
    assert computed.vision_bytes == exact and not computed.exact
    assert cost.vision_cost(config, tower_bytes=exact).exact


def test_processor_limits_come_from_the_files(tiny_vlm_path):
    limits = cost.ProcessorLimits.from_files(tiny_vlm_path)
    assert (limits.max_pixels, limits.min_pixels, limits.patch_size, limits.merge_size) == (256 * 256, 32 * 32, 16, 2)
    assert limits.max_image_tokens == 64
    assert cost.ProcessorLimits.from_files(tiny_vlm_path / "missing").max_pixels == cost.DEFAULT_MAX_PIXELS


def test_activation_memory_grows_with_the_processors_maximum():
    vision = {"hidden_size": 768, "intermediate_size": 3072, "depth": 12, "patch_size": 16, "out_hidden_size": 1024}
    small = cost.image_activation_bytes(vision, cost.ProcessorLimits(max_pixels=1024 * 1024))
    large = cost.image_activation_bytes(vision, cost.ProcessorLimits(max_pixels=4096 * 4096))
    assert 15 * small < large <= 16 * small


def test_text_only_config_costs_nothing():
    assert cost.vision_cost({"text_config": {"hidden_size": 64}}) == cost.VisionCost()


def test_real_configs_give_a_tower_of_the_published_order():
    # Qwen3.5-0.8B: a 12-block 768-wide tower (~0.1 B params); 35B-A3B: 27 blocks 1152 wide (~0.45 B), both bf16.
    small = json.loads((REFERENCE / "Qwen3.5-0.8B.config.json").read_text())
    big = json.loads((REFERENCE / "Qwen3.5-35B-A3B.config.json").read_text())
    assert 0.09e9 < cost.tower_parameters(small["vision_config"]) < 0.11e9
    assert 0.42e9 < cost.tower_parameters(big["vision_config"]) < 0.47e9
    assert cost.vision_cost(big).vision_bytes == 2 * cost.tower_parameters(big["vision_config"])
