"""Does a build accept images, and what do they cost: from its files when known, else the last hub refresh, else
the built-in catalog.

In order of trust:
1. files on this machine (a local folder or a complete download): config.json + the safetensors headers
   (exact tower bytes) + preprocessor_config.json;
2. the last `refresh_from_hub()` (``qwen-desk models --refresh``, the library's refresh): the same read from
   the hub (config.json, preprocessor_config.json, safetensors headers by range requests), cached under the app
   home;
3. resources/catalog.json: a model's ``vision_config`` and each build's ``vision`` (true: every Qwen3.5 checkpoint
   is vision-language, so a build sees unless its card says otherwise; false: the card says text-only, e.g. the
   397B-A17B 4-bit; null: not known); bytes computed from the config where the family reference gives one (0.8B,
   35B-A3B), else not known (`cost` None) until the files are read.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterable

from macapp.core import paths
from macapp.core.catalog import ModelRef, hub_endpoint, hub_offline, hub_reachable
from macapp.core.vision.capability import folder_support, support_from_tensors
from macapp.core.vision.cost import ProcessorLimits, VisionCost, vision_cost

VISION_CACHE = "vision-refresh.json"
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
    folder = ref.local_path or _downloaded_folder(ref.repo)
    if folder is not None and (Path(folder) / "config.json").is_file():
        return from_folder(Path(folder))
    hit = _read_cache().get(ref.repo or "")
    if hit:
        return _from_record(hit)
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


def _from_record(hit: dict[str, Any]) -> BuildVision:
    if not hit.get("accepts_images"):
        return BuildVision(False, VisionCost(), Source.HUB, hit.get("note", "the hub's files hold no vision tower"))
    limits = ProcessorLimits.from_dict(hit.get("processor") or {})
    return BuildVision(True, vision_cost(hit.get("config") or {}, limits, hit.get("tower_bytes")), Source.HUB)


@functools.cache
def _catalog_rows() -> dict[str, tuple[dict, Any]]:
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
        return BuildVision(False, VisionCost(), Source.CATALOG, row.get("vision_note", "its MLX conversion is text-only"))
    cost = vision_cost(config) if config["vision_config"] else None
    if flag is None:
        return BuildVision(None, cost, Source.CATALOG, "not known until its files are read: `qwen-desk models --refresh`")
    return BuildVision(True, cost, Source.CATALOG, CATALOG_SEES)


def seeing_alternative(build: str) -> str | None:
    """A catalog build that accepts pictures, to name in a text-only build's message: another build of the same
    model first (`build`: a repo id or a folder name holding the model's name), else the smallest one that sees."""
    from macapp.core import catalog

    entries = catalog.builtin_catalog()
    same = [e for e in entries if e.name in build or any(b.repo == build for b in e.builds.values())]
    for entry in same + entries:
        for bits in sorted(entry.builds):
            candidate = entry.builds[bits]
            if candidate.repo != build and build_vision(catalog.model_ref(entry, candidate)).accepts_images is True:
                return candidate.repo
    return None


def _downloaded_folder(repo: str | None) -> Path | None:
    if not repo:
        return None
    try:
        from macapp.core.download.local import inspect_repo

        local = inspect_repo(repo)
    except Exception:  # an unreadable cache is "not downloaded" here
        return None
    return local.path if local is not None and local.complete else None


# --- hub refresh ---


def _cache_path() -> Path:
    return paths.cache_dir() / VISION_CACHE


def _read_cache() -> dict[str, Any]:
    try:
        data = json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _hub_json(repo: str, name: str) -> dict | None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        path = hf_hub_download(repo, name, endpoint=hub_endpoint(), cache_dir=paths.cache_dir() / "hub-configs")
    except EntryNotFoundError:
        return None
    data = json.loads(Path(path).read_text())
    return data if isinstance(data, dict) else None


def hub_record(repo: str) -> dict[str, Any]:
    """What the hub's real files say about a repo's images (config, processor, tower tensors from the headers)."""
    from huggingface_hub import HfApi

    config = _hub_json(repo, "config.json") or {}
    meta = HfApi(endpoint=hub_endpoint()).get_safetensors_metadata(repo)
    tensors = [
        (name, info.data_offsets[1] - info.data_offsets[0])
        for file_meta in meta.files_metadata.values()
        for name, info in file_meta.tensors.items()
    ]
    support = support_from_tensors(config, tensors)
    processor = (_hub_json(repo, "preprocessor_config.json") or {}) if support.sees else {}
    return {
        "accepts_images": support.sees,
        "tower_bytes": support.tower_bytes,
        "note": support.why_not,
        "config": {"vision_config": config.get("vision_config"), "text_config": config.get("text_config") or {}, "torch_dtype": config.get("torch_dtype")},
        "processor": processor,
        "fetched_at": time.time(),
    }


def refresh_catalog_and_pictures(entries: list | None = None) -> dict[str, str]:
    """`catalog.refresh_catalog()` (its repo → error), then `refresh_from_hub` for the same builds. A build whose
    pictures could not be learnt (e.g. unreadable safetensors headers) is logged and stays "not known" ("?")."""
    from macapp.core import catalog

    entries = entries or catalog.builtin_catalog()
    errors = catalog.refresh_catalog(entries)
    for repo, error in refresh_from_hub(build.repo for entry in entries for build in entry.builds.values()).items():
        if repo not in errors:
            log.warning("could not learn whether %s accepts pictures: %s", repo, error)
    return errors


def refresh_from_hub(repos: Iterable[str]) -> dict[str, str]:
    """Learn each repo's images from its real files on the hub and cache it; returns repo → error for failures."""
    if hub_offline():
        return {"*": "HF_HUB_OFFLINE is set: using the built-in catalog for images"}
    if not hub_reachable():
        return {"*": f"the hub ({hub_endpoint() or 'huggingface.co'}) cannot be reached: using the built-in catalog for images"}
    cache = _read_cache()
    errors: dict[str, str] = {}
    for repo in repos:
        try:
            cache[repo] = hub_record(repo)
        except Exception as exc:  # one unreachable repo must not stop the rest
            errors[repo] = f"{type(exc).__name__}: {exc}"
    _cache_path().write_text(json.dumps(cache, indent=1))
    return errors
