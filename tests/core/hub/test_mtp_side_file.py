"""The side file beside a build in the HF cache: the loaders read the build as before, the cache stays scannable."""

from __future__ import annotations

import shutil

import mlx.core as mx
from mlx.utils import tree_flatten

from macapp.core.hub.mtp_fetch import fetch_mtp_head, plan_mtp_fetch
from tests.fixtures.mtp import BUILD


def _params(model) -> dict:
    return dict(tree_flatten(model.parameters()))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]).item() for k in a)


def test_mlx_lm_and_mlx_vlm_load_the_build_identically_with_the_side_file_present(served, build_folder, tmp_path):
    import mlx_lm
    from mlx_vlm.utils import load_model

    pristine = shutil.copytree(build_folder, tmp_path / "pristine", symlinks=False)
    result = fetch_mtp_head(plan_mtp_fetch(build_folder, BUILD))
    assert result.side_file.is_file() and result.side_file.parent.parent == build_folder.parent.parent  # models--org--name/
    lm_with, _ = mlx_lm.load(str(build_folder))
    lm_without, _ = mlx_lm.load(str(pristine))
    assert _same(_params(lm_with), _params(lm_without))
    assert not any("mtp" in k for k in _params(lm_with))
    assert _same(_params(load_model(build_folder)), _params(load_model(pristine)))


def test_the_hf_cache_scans_cleanly_and_deleting_the_build_removes_its_head(served, build_folder):
    from huggingface_hub import scan_cache_dir

    from macapp.core.download import delete_model, hub_cache_dir, inspect_repo

    result = fetch_mtp_head(plan_mtp_fetch(build_folder, BUILD))
    report = scan_cache_dir(hub_cache_dir())
    assert report.warnings == []
    repo = next(r for r in report.repos if r.repo_id == BUILD)
    assert {rev.commit_hash for rev in repo.revisions} == {build_folder.name}
    assert inspect_repo(BUILD).ready  # the download's own view of the build is unchanged
    delete_model(BUILD)
    assert not result.side_file.exists()


def test_the_engine_makes_a_drafter_of_the_fetched_head(served, build_folder):
    """The contract with the engine's head loader (macapp/core/engine/mtp_head.py): names, quantization, shapes."""
    from macapp.core.engine.model_folder import check_model_folder, load_model
    from macapp.core.engine.mtp_head import load_mtp_head

    loaded = load_model(build_folder, check_model_folder(build_folder))
    assert load_mtp_head(loaded) is None  # the build alone has no head
    result = fetch_mtp_head(plan_mtp_fetch(build_folder, BUILD))
    head = load_mtp_head(loaded)
    assert head is not None and head.source == result.side_file
    quantized = [m for _, m in head.drafter.named_modules() if type(m).__name__ == "QuantizedLinear"]
    assert quantized and all(m.bits == 4 and m.group_size == 64 for m in quantized)
