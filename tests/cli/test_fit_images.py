"""`qwen-desk fit --json` reports vision_bytes and one picture's activation memory; --images counts them in the
verdict; text-only keeps today's number; `qwen-desk models` says which builds accept images."""

from __future__ import annotations

import json

from macapp.cli import main
from macapp.core.vision.capability import folder_support
from tests.fixtures.vision import tiny_vlm_path, tiny_vlm_text_only_path  # noqa: F401  (fixtures)


def _fit(capsys, *argv):
    assert main(["fit", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_fit_json_gains_the_towers_exact_bytes_and_text_only_keeps_its_total(capsys, tiny_vlm_path):
    text = _fit(capsys, str(tiny_vlm_path), "--context", "4096")
    tower = folder_support(tiny_vlm_path).tower_bytes
    assert text["vision_bytes"] == tower and text["image_activation_bytes"] > 0
    assert text["accepts_images"] is True and text["images"] is False
    assert text["total_bytes"] == text["weights_bytes"] + text["kv_cache_bytes"] + text["state_bytes"] + text["overhead_bytes"]
    with_images = _fit(capsys, str(tiny_vlm_path), "--context", "4096", "--images")
    assert with_images["images"] is True
    assert with_images["total_bytes"] == text["total_bytes"] + tower + text["image_activation_bytes"]
    assert with_images["weights_bytes"] == text["weights_bytes"]  # mlx-lm's weights: the tower is apart


def test_images_push_a_build_over_the_budget(capsys):
    # Qwen3.5-0.8B's tower and a 16-megapixel picture cost ~1.7 GB: on an 8 GB M1 at a context that just fits
    # text-only, the picture tips it over.
    plain = _fit(capsys, "Qwen3.5-0.8B", "--bits", "8", "--chip", "M1", "--memory", "8GB", "--context", "4096")
    images = _fit(capsys, "Qwen3.5-0.8B", "--bits", "8", "--chip", "M1", "--memory", "8GB", "--context", "4096", "--images")
    assert images["total_bytes"] - plain["total_bytes"] == plain["vision_bytes"] + plain["image_activation_bytes"] > 1e9
    assert images["max_context"] < plain["max_context"]


def test_a_text_only_build_reports_zero_and_its_total_does_not_move(capsys):
    plain = _fit(capsys, "Qwen3.5-397B-A17B", "--bits", "4")
    images = _fit(capsys, "Qwen3.5-397B-A17B", "--bits", "4", "--images")
    assert plain["vision_bytes"] == 0 and plain["accepts_images"] is False
    assert images["total_bytes"] == plain["total_bytes"] and images["images"] is False


def test_human_fit_and_models_say_which_builds_accept_images(capsys, tiny_vlm_path):
    assert main(["fit", str(tiny_vlm_path), "--context", "4096"]) == 0
    assert "images: vision tower" in capsys.readouterr().out
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "images" in out.splitlines()[1]
    row = next(line for line in out.splitlines() if line.startswith("Qwen3.5-397B-A17B") and " 4 " in line[:26])
    assert "text only" in row
    rows = json.loads((main(["models", "--json"]), capsys.readouterr().out)[1])
    assert {r["accepts_images"] for r in rows} == {True, False}
    assert [r["repo"] for r in rows if r["accepts_images"] is False] == ["mlx-community/Qwen3.5-397B-A17B-4bit"]


def test_a_build_that_sees_with_no_known_tower_size_is_not_counted_and_says_so(capsys):
    # Qwen3.5-2B sees (every Qwen3.5 checkpoint does) but no vision_config is at hand until its files are read
    plain = _fit(capsys, "Qwen3.5-2B", "--bits", "4")
    images = _fit(capsys, "Qwen3.5-2B", "--bits", "4", "--images")
    assert plain["accepts_images"] is True and plain["vision_bytes"] is None and plain["image_activation_bytes"] is None
    assert images["total_bytes"] == plain["total_bytes"] and images["images"] is False
    assert any("images not counted" in line for line in images["derivation"])
    assert main(["fit", "Qwen3.5-2B", "--bits", "4", "--images"]) == 0
    assert "images: yes, but the vision tower's size is not known" in capsys.readouterr().out


def test_models_refresh_learns_from_the_hubs_real_files_over_the_catalog(capsys, hub_server, tiny_vlm_path, tiny_vlm_text_only_path):
    hub_server.add_repo("mlx-community/Qwen3.5-0.8B-4bit", tiny_vlm_text_only_path)  # this conversion dropped the tower
    hub_server.add_repo("mlx-community/Qwen3.5-2B-4bit", tiny_vlm_path)

    def rows():
        return {(r["model"], r["bits"]): r for r in json.loads(capsys.readouterr().out)}

    assert main(["models", "--json"]) == 0
    before = rows()
    assert before[("Qwen3.5-0.8B", 4)]["accepts_images"] is True  # the catalog: every Qwen3.5 checkpoint sees
    assert main(["models", "--refresh", "--json"]) == 0
    after = rows()
    assert after[("Qwen3.5-0.8B", 4)]["accepts_images"] is False
    assert after[("Qwen3.5-2B", 4)]["accepts_images"] is True
    assert after[("Qwen3.5-2B", 4)]["vision_bytes"] == folder_support(tiny_vlm_path).tower_bytes  # exact, from the hub's headers
