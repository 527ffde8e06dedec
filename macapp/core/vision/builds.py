"""Does a build accept images, and what do they cost: from its files when known, else the last hub refresh, else
the built-in catalog.

In order of trust:
1. files on this machine (a local folder or a complete download): config.json + the safetensors headers
   (exact tower bytes) + preprocessor_config.json;
2. the repo's hub record from the last refresh (``qwen-desk models --refresh``, the library's refresh,
   `refresh_from_hub()`): the same read from the hub (config.json, preprocessor_config.json, safetensors headers by
   range requests), the one record the catalog's sizes come from too (`macapp.core.hub.record`);
3. resources/catalog.json: a model's ``vision_config`` and each build's ``vision`` (true: every Qwen3.5 checkpoint
   is vision-language, so a build sees unless its card says otherwise; false: the card says text-only, e.g. the
   397B-A17B 4-bit; null: not known); bytes computed from the config where the family reference gives one (0.8B,
   35B-A3B), else not known (`cost` None) until the files are read.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Iterable

from macapp.core import catalog, paths
from macapp.core.catalog import CatalogEntry, ModelRef
from macapp.core.download.local import inspect_repo
from macapp.core.jsonvalue import JSONObject, JSONValue
from macapp.core.hub.record import HubModelRecord, cached_record, refresh_records
from macapp.core.hub.settings import hub_reachable, hub_settings
from macapp.core.tensor_roles import TensorRole
from macapp.core.vision.capability import folder_support, support_from_tensors
from macapp.core.fit.picture_cost import ProcessorLimits, VisionCost, vision_cost

CATALOG_SEES = "every Qwen3.5 checkpoint sees; its own files confirm it on download or `qwen-desk models --refresh`"
log = logging.getLogger(__name__)


class Source(str, Enum):
    FILES = "files"
    HUB = "hub"
    CATALOG = "catalog"


@dataclass(frozen=True)
class BuildVision:
    accepts_images: bool | None  # None: not known until the hub is read
    cost: VisionCost | None  # None: the tower's size is not known (no vision_config at hand)
    source: Source
    note: str = ""  # why text-only, or why unknown

    @property
    def label(self) -> str:
        """'images', 'text only' or '?' for lists."""
        return {True: "images", False: "text only", None: "?"}[self.accepts_images]


def build_vision(ref: ModelRef) -> BuildVision:
    folder = ref.local_path or downloaded_folder(ref.repo)
    if folder is not None and (Path(folder) / "config.json").is_file():
        return from_folder(Path(folder))
    record = cached_record(ref.repo)
    if record is not None and record.headers_read:
        return from_record(record)
    return _from_catalog(ref.repo)


def from_folder(folder: Path) -> BuildVision:
    support = folder_support(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if not support.sees:
        return BuildVision(False, VisionCost(), Source.FILES, support.why_not)
    cost = vision_cost(config, ProcessorLimits.from_files(folder), support.tower_bytes if support.exact else None)
    return BuildVision(True, cost, Source.FILES)


def from_record(record: HubModelRecord) -> BuildVision:
    """What a hub record (config, tower tensors from the headers, processor) says about images."""
    support = support_from_tensors(record.config, ((t.name, t.nbytes) for t in record.role_tensors(TensorRole.VISION)))
    if not support.sees:
        return BuildVision(False, VisionCost(), Source.HUB, support.why_not or "the hub's files hold no vision tower")
    config = record.config
    vision = {"vision_config": config.get("vision_config"), "text_config": config.get("text_config") or {}, "torch_dtype": config.get("torch_dtype")}
    return BuildVision(True, vision_cost(vision, ProcessorLimits.from_dict(record.processor), support.tower_bytes), Source.HUB)


@functools.cache
def _catalog_rows() -> dict[str, tuple[JSONObject, JSONValue]]:
    """repo → (the model's row, its build's `vision` flag) from resources/catalog.json."""
    data = json.loads((paths.resources_dir() / "catalog.json").read_text())
    rows = {}
    for row in data["models"]:
        for build in row["builds"].values():
            rows[build["repo"]] = (row, build.get("vision"))
    return rows


def _from_catalog(repo: str | None) -> BuildVision:
    row, flag = _catalog_rows().get(repo or "", ({}, None))
    config = {"vision_config": row.get("vision_config"), "text_config": row.get("text_config") or {}}
    if flag is False:
        note = row.get("vision_note", "its MLX conversion is text-only")
        return BuildVision(False, VisionCost(), Source.CATALOG, str(note))
    cost = vision_cost(config) if config["vision_config"] else None
    if flag is None:
        return BuildVision(None, cost, Source.CATALOG, "not known until its files are read: `qwen-desk models --refresh`")
    return BuildVision(True, cost, Source.CATALOG, CATALOG_SEES)


def seeing_alternative(build: str) -> str | None:
    """A catalog build that accepts pictures, to name in a text-only build's message: another build of the same
    model first (`build`: a repo id or a folder name holding the model's name), else the smallest one that sees."""
    entries = catalog.builtin_catalog()
    same = [e for e in entries if e.name in build or any(b.repo == build for b in e.builds.values())]
    for entry in same + entries:
        for bits in sorted(entry.builds):
            candidate = entry.builds[bits]
            if candidate.repo != build and build_vision(catalog.model_ref(entry, candidate)).accepts_images is True:
                return candidate.repo
    return None


def downloaded_folder(repo: str | None) -> Path | None:
    """The snapshot folder of a complete download of `repo`, or None."""
    if not repo:
        return None
    try:
        local = inspect_repo(repo)
    except Exception:  # an unreadable cache is "not downloaded" here
        return None
    return local.path if local is not None and local.complete else None


# --- hub refresh ---


def refresh_catalog_and_pictures(entries: list[CatalogEntry] | None = None) -> dict[str, str]:
    """`catalog.refresh_catalog()`: one hub record per build gives both its sizes and its pictures (returns repo →
    error). A build whose safetensors headers could not be read is logged and its pictures stay "not known" ("?")."""
    entries = entries or catalog.builtin_catalog()
    errors = catalog.refresh_catalog(entries)
    lacking_mtp = []
    for entry in entries:
        for build in entry.builds.values():
            record = cached_record(build.repo)
            if build.repo not in errors and record is not None and not record.headers_read:
                log.warning("could not learn whether %s accepts pictures: %s", build.repo, record.headers_error)
            if record is not None and record.headers_read and not record.has_mtp:
                lacking_mtp.append(entry.base_repo)
    if lacking_mtp and "*" not in errors:
        # The originals the builds were converted from: their MTP head's bytes ("X MB to fetch" in the fit and library).
        for repo, error in refresh_records(lacking_mtp)[1].items():
            log.warning("could not read the MTP head of %s: %s", repo, error)
    return errors


def refresh_from_hub(repos: Iterable[str]) -> dict[str, str]:
    """Learn each repo's images from its real files on the hub (its hub record, cached); returns repo → error."""
    settings = hub_settings()
    if settings.offline:
        return {"*": "HF_HUB_OFFLINE is set: using the built-in catalog for images"}
    if not hub_reachable():
        return {"*": f"the hub ({settings.host_label}) cannot be reached: using the built-in catalog for images"}
    records, errors = refresh_records(repos)
    for repo, record in records.items():
        if not record.headers_read:
            errors[repo] = record.headers_error
    return errors
