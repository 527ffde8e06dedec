"""Which builds accept images and what they cost: files first, then the hub's real files, then the catalog."""

from __future__ import annotations


from macapp.core import catalog
from macapp.core.vision import builds
from macapp.core.vision.builds import Source, build_vision
from macapp.core.vision.capability import folder_support


def test_a_local_folder_with_its_tower(tiny_vlm_path):
    seen = build_vision(catalog.resolve_model(str(tiny_vlm_path)))
    assert seen.accepts_images is True and seen.source is Source.FILES and seen.label == "images"
    assert seen.cost.exact and seen.cost.vision_bytes == folder_support(tiny_vlm_path).tower_bytes
    assert seen.cost.max_image_tokens == 64 and seen.cost.image_activation_bytes > 0


def test_a_local_text_only_conversion(tiny_vlm_text_only_path):
    seen = build_vision(catalog.resolve_model(str(tiny_vlm_text_only_path)))
    assert seen.accepts_images is False and seen.cost.vision_bytes == 0 and "no vision tower" in seen.note


def test_the_catalog_knows_the_397b_4bit_is_text_only_and_every_other_build_sees():
    big = catalog.resolve_model("Qwen3.5-397B-A17B", 4)
    seen = build_vision(big)
    assert seen.accepts_images is False and seen.source is Source.CATALOG and "text-only" in seen.note
    # every Qwen3.5 checkpoint is vision-language (the family reference); only the 397B-A17B 4-bit card says otherwise
    small = build_vision(catalog.resolve_model("Qwen3.5-0.8B", 4))
    assert small.accepts_images is True and small.source is Source.CATALOG and "--refresh" in small.note
    assert small.cost.vision_bytes > 0 and not small.cost.exact  # computed from the verified vision_config
    no_config = build_vision(catalog.resolve_model("Qwen3.5-2B", 4))
    assert no_config.accepts_images is True and no_config.cost is None  # no vision_config at hand: size not known
    flags = {b.repo: build_vision(catalog.model_ref(e, b)).accepts_images for e in catalog.builtin_catalog() for b in e.builds.values()}
    assert [repo for repo, sees in flags.items() if not sees] == ["mlx-community/Qwen3.5-397B-A17B-4bit"]


def test_a_text_only_build_is_pointed_at_a_concrete_build_that_sees(tiny_vlm_text_only_path, hub_server):
    assert builds.seeing_alternative("mlx-community/Qwen3.5-397B-A17B-4bit") == "mlx-community/Qwen3.5-397B-A17B-8bit"
    assert builds.seeing_alternative("my-text-only-folder") == "mlx-community/Qwen3.5-0.8B-4bit"  # the smallest
    hub_server.add_repo("mlx-community/Qwen3.5-397B-A17B-8bit", tiny_vlm_text_only_path)  # the hub says: no tower
    assert builds.refresh_from_hub(["mlx-community/Qwen3.5-397B-A17B-8bit"]) == {}
    assert builds.seeing_alternative("mlx-community/Qwen3.5-397B-A17B-4bit") == "mlx-community/Qwen3.5-0.8B-4bit"


def test_refresh_learns_it_from_the_hubs_real_files(hub_server, tiny_vlm_path, tiny_vlm_text_only_path):
    hub_server.add_repo("mlx-community/Qwen3.5-0.8B-4bit", tiny_vlm_path)
    hub_server.add_repo("mlx-community/Qwen3.5-397B-A17B-8bit", tiny_vlm_text_only_path)
    errors = builds.refresh_from_hub(["mlx-community/Qwen3.5-0.8B-4bit", "mlx-community/Qwen3.5-397B-A17B-8bit", "nobody/missing"])
    assert set(errors) == {"nobody/missing"}
    seen = build_vision(catalog.resolve_model("Qwen3.5-0.8B", 4))
    assert seen.source is Source.HUB and seen.accepts_images is True
    assert seen.cost.exact and seen.cost.vision_bytes == folder_support(tiny_vlm_path).tower_bytes
    assert seen.cost.max_image_tokens == 64  # its preprocessor_config.json was read
    assert build_vision(catalog.resolve_model("Qwen3.5-397B-A17B", 8)).accepts_images is False


def test_refresh_offline_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE" in builds.refresh_from_hub(["mlx-community/Qwen3.5-0.8B-4bit"])["*"]
