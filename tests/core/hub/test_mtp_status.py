"""Where a build's MTP head comes from, known after a catalog refresh without downloading anything."""

from __future__ import annotations

from macapp.core import catalog
from macapp.core.hub.mtp import MtpWhere, quantized_bytes, record_rule, status_for
from macapp.core.hub.record import cached_record
from macapp.core.memory import format_bytes
from macapp.core.vision.builds import refresh_catalog_and_pictures
from tests.fixtures.mtp import mtp_repos  # noqa: F401


def test_a_refresh_reads_the_originals_head_so_the_fit_knows_what_to_fetch(hub_server, mtp_repos):
    build, original = "mlx-community/Qwen3.5-0.8B-4bit", "Qwen/Qwen3.5-0.8B"
    hub_server.add_repo(build, {k: v for k, v in mtp_repos.build_files.items() if k != "README.md"})
    hub_server.add_repo(original, mtp_repos.original_files)
    entries = [e for e in catalog.builtin_catalog() if e.name == "Qwen3.5-0.8B"]
    assert status_for(build, None).where is MtpWhere.UNKNOWN
    errors = refresh_catalog_and_pictures(entries)
    assert set(errors) == {"mlx-community/Qwen3.5-0.8B-8bit"}  # not served; the original's read is not a catalog error
    status = status_for(build, None)
    source = cached_record(original)
    assert status.where is MtpWhere.TO_FETCH and status.source_repo == original
    assert status.fetch_bytes == sum(v.nbytes for v in mtp_repos.head.values()) == source.mtp_bytes
    assert status.head_bytes == quantized_bytes(source, record_rule(cached_record(build))) < status.fetch_bytes
    assert status.label == f"MTP: {format_bytes(status.fetch_bytes)} to fetch"


def test_a_build_whose_own_files_hold_the_head_needs_nothing(hub_server, mtp_repos):
    hub_server.add_repo("someone/Qwen3.5-with-head", mtp_repos.original_files)
    catalog.resolve_model("someone/Qwen3.5-with-head")  # reads (and caches) its hub record
    status = status_for("someone/Qwen3.5-with-head", None)
    assert status.where is MtpWhere.IN_BUILD and status.usable and status.head_bytes == sum(v.nbytes for v in mtp_repos.head.values())
