"""Planning a download against the hub stand-in: exact sizes and hashes, the fit verdict, the disk check."""

from __future__ import annotations

import hashlib

import pytest

from macapp.core import download as dl
from tests.fixtures.downloads import FAST, NEEDED, REPO, SHARD1, needed_bytes
from tests.fixtures.hub import random_repo_files


def test_plan_gives_exact_sizes_and_hashes_of_only_the_needed_files_and_fetches_nothing(hub_server, repo):
    plan = dl.plan_download(REPO)
    assert {f.remote.path for f in plan.files} == NEEDED  # no README, .gitattributes or original/*.pth
    assert plan.bytes_total == needed_bytes(repo)
    for f in plan.files:
        served = repo.files[f.remote.path]
        assert f.remote.size == served.size and f.state == "missing"
        if f.remote.is_weight:
            assert f.remote.sha256 == hashlib.sha256(served.data).hexdigest()
    assert plan.commit == repo.commit and plan.disk_ok and plan.disk_free > plan.bytes_total
    assert hub_server.bytes_served() == 0 and not hub_server.file_requests(method="HEAD")


def test_plan_with_a_catalog_model_carries_the_fit_verdict(hub_server):
    from macapp.core.catalog import resolve_model

    model = resolve_model("Qwen3.5-0.8B", 4)
    hub_server.add_repo(model.repo, random_repo_files())
    plan = dl.plan_download(model.repo, model=model, context=4096)
    assert plan.fit is not None, plan.fit_note
    assert plan.fit.verdict in ("fits", "tight", "too_big") and plan.fit.context == 4096
    assert plan.fit.weights_bytes == plan.weights_bytes  # the exact listing, not the catalog's guess


def test_without_a_context_the_fit_is_judged_at_the_apps_one_default_context(hub_server):
    from macapp.core.fit import estimate
    from macapp.core.catalog import resolve_model

    model = resolve_model("Qwen3.5-0.8B", 4)
    hub_server.add_repo(model.repo, random_repo_files())
    plan = dl.plan_download(model.repo, model=model)
    assert plan.fit is not None, plan.fit_note
    assert plan.fit.context == estimate.DEFAULT_CONTEXT  # what `qwen-desk fit` and the window use


def test_not_enough_disk_is_refused_before_any_byte_is_fetched(hub_server):
    files = random_repo_files()
    hub_server.add_repo(REPO, files, claimed_sizes={SHARD1: 50 * 1024**4})  # the listing says 50 TB
    plan = dl.plan_download(REPO)
    assert not plan.disk_ok and "disk space" in plan.disk_message()
    from macapp.core.memory import format_bytes

    # Decimal units like `qwen-desk fit` and the window: 50 TiB of claimed shard is "55.0 TB", not "51200.00 GB".
    assert f"{format_bytes(plan.bytes_to_fetch)} to fetch" in plan.disk_message()
    assert format_bytes(plan.bytes_to_fetch) == "55.0 TB"
    with pytest.raises(dl.DownloadError) as err:
        dl.download(plan, settings=FAST)
    assert err.value.kind == "disk_full" and "free" in str(err.value)
    assert "55.0 TB to fetch" in str(err.value)
    assert hub_server.bytes_served() == 0
