"""One typed hub record per repo (macapp/core/hub/record.py): read by range requests, cached once, used by all."""

from __future__ import annotations

from macapp.core import catalog
from macapp.core.hub.record import cached_record, fetch_record, store_records
from macapp.core.hub.remote import FIRST_READ
from macapp.core.tensor_roles import TensorRole
from macapp.core.vision.builds import Source, build_vision
from tests.fixtures.mtp import ORIGINAL, mtp_repos, served  # noqa: F401
from tests.fixtures.vision import tiny_vlm_path  # noqa: F401  (fixture)


def test_a_record_holds_files_tensors_by_role_and_the_card_without_reading_tensor_data(served, mtp_repos):
    record = fetch_record(ORIGINAL)
    assert record.revision == served.repos[ORIGINAL].commit
    assert record.file_sizes == {p: len(b) for p, b in mtp_repos.original_files.items()}
    shards = [p for p in mtp_repos.original_files if p.endswith(".safetensors")]
    requests = served.file_requests("*.safetensors")
    assert {r.file for r in requests} == set(shards) and all(r.range and r.range.startswith("bytes=0-") for r in requests)
    assert all(r.body_bytes <= FIRST_READ for r in requests)  # the headers, not the tensors
    assert sum(r.body_bytes for r in requests) < sum(len(mtp_repos.original_files[s]) for s in shards) / 4
    assert record.mtp_bytes == sum(v.nbytes for v in mtp_repos.head.values()) and record.has_mtp
    assert record.role_bytes(TensorRole.VISION) > 0 and record.role_bytes(TensorRole.LANGUAGE) > 0
    head = {t.name: t for t in record.role_tensors(TensorRole.MTP)}
    assert head["mtp.fc.weight"].dtype == "BF16" and head["mtp.fc.weight"].shape == tuple(mtp_repos.head["mtp.fc.weight"].shape)
    store_records([record])
    assert cached_record(ORIGINAL) == record  # the JSON round trip keeps every field


def test_one_refresh_serves_the_catalogs_sizes_and_visions_answer(hub_server, tiny_vlm_path):
    hub_server.add_repo("mlx-community/Qwen3.5-0.8B-4bit", tiny_vlm_path)
    entries = [e for e in catalog.builtin_catalog() if e.name == "Qwen3.5-0.8B"]
    catalog.refresh_catalog(entries)
    record = cached_record("mlx-community/Qwen3.5-0.8B-4bit")
    assert record is not None and record.processor  # the seeing build's preprocessor_config.json came with it
    hub_server.reset_log()
    seen = build_vision(catalog.resolve_model("Qwen3.5-0.8B", 4))
    assert seen.source is Source.HUB and seen.accepts_images and seen.cost.vision_bytes == record.role_bytes(TensorRole.VISION)
    assert catalog.resolve_model("Qwen3.5-0.8B", 4).weights_bytes == record.role_bytes(TensorRole.LANGUAGE)
    assert hub_server.log == []  # neither asked the hub again
