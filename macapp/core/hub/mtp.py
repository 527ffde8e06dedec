"""Where a build's MTP head comes from: its own shards, the side file fetched for it, the original Qwen repo (so many
bytes to fetch), or nowhere. What the fit, the library and `qwen-desk download --mtp` say about it.

A head is the `mtp.*` tensors under the original checkpoint's names (macapp.core.tensor_roles), either in the
build's own safetensors files or in `modelfiles.mtp_side_file(folder)`. MLX conversions made with mlx-lm drop them
(its sanitize does); the original repo (`Qwen/<model>`, the catalog's row, or the card's ``base_model``) keeps them
unquantized, so the bytes to fetch are the original's and the bytes in memory those of the head quantized like the
build (`quantized_bytes`, the rule of `mtp_quant`).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path

from macapp.core import catalog
from macapp.core.hub.record import HubModelRecord, cached_record, readme_base_model
from macapp.core.hub.mtp_quant import QuantRule
from macapp.core.jsonvalue import JSONObject
from macapp.core.memory import format_bytes
from macapp.core.modelfiles import SafetensorsError, mtp_side_file, read_safetensors_header, text_config
from macapp.core.tensor_roles import TensorRole, tensor_role

SIDE_FILE_MARK = "qwen_desk.mtp.source_repo"  # __metadata__ key every side file we write carries


class MtpWhere(enum.StrEnum):
    IN_BUILD = "in_build"  # the build's own shards hold it
    FETCHED = "fetched"  # the side file beside the build holds it
    TO_FETCH = "to_fetch"  # the original repo has it: `qwen-desk download <build> --mtp` fetches it
    NONE = "none"  # no head anywhere (the model has none, or the original repo lacks it)
    UNKNOWN = "unknown"  # not known until the original repo's headers are read (offline, never asked)


@dataclass(frozen=True)
class MtpStatus:
    where: MtpWhere
    head_bytes: int = 0  # in memory, quantized like the build (an estimate for TO_FETCH)
    fetch_bytes: int = 0  # bytes to download from the original repo (TO_FETCH)
    source_repo: str | None = None  # the repo it comes (or would come) from
    note: str = ""

    @property
    def usable(self) -> bool:
        """On disk now: the engine can load it."""
        return self.where in (MtpWhere.IN_BUILD, MtpWhere.FETCHED)

    @property
    def label(self) -> str:
        """'MTP: available', 'MTP: 12 MB to fetch', 'MTP: none' or 'MTP: not known yet' for the library."""
        if self.usable:
            return "MTP: available"
        if self.where is MtpWhere.TO_FETCH:
            return f"MTP: {format_bytes(self.fetch_bytes)} to fetch"
        return "MTP: none" if self.where is MtpWhere.NONE else "MTP: not known yet"

    def to_json(self) -> JSONObject:
        return {"where": str(self.where), "head_bytes": self.head_bytes, "fetch_bytes": self.fetch_bytes, "source_repo": self.source_repo, "note": self.note}


def model_has_mtp(config: JSONObject) -> bool | None:
    """What the config says: True/False from ``mtp_num_hidden_layers``, None when it does not say."""
    value = text_config(config).get("mtp_num_hidden_layers", config.get("mtp_num_hidden_layers"))
    return None if value is None else bool(value)


# --- the build's own files -------------------------------------------------------------------------------------
def folder_mtp_bytes(folder: Path) -> int:
    """Bytes of the `mtp.*` tensors in a folder's own safetensors files (0: none, or headers unreadable)."""
    total = 0
    for path in sorted(Path(folder).glob("*.safetensors")):
        try:
            total += sum(end - start for name, (start, end) in read_safetensors_header(path).tensors.items() if tensor_role(name) is TensorRole.MTP)
        except (OSError, SafetensorsError):
            continue
    return total


def side_file_bytes(folder: Path) -> int:
    """Tensor bytes of a complete side file written by us beside `folder` (0 when there is none, or it is not whole)."""
    side = mtp_side_file(folder)
    try:
        header = read_safetensors_header(side)
        if SIDE_FILE_MARK not in header.metadata or header.header_bytes + header.data_bytes != side.stat().st_size:
            return 0
    except (OSError, SafetensorsError):
        return 0
    return header.data_bytes


def build_quantization(config: JSONObject) -> tuple[int | None, int]:
    quant = config.get("quantization") or config.get("quantization_config") or {}
    if not isinstance(quant, dict):
        return None, 64
    bits, group = quant.get("bits"), quant.get("group_size", 64) or 64
    if not isinstance(group, (int, float, str)):
        raise TypeError(f"quantization group_size must be a number, not {group!r}")
    return (bits if isinstance(bits, int) else None), int(group)


def build_dtype(config: JSONObject, dtypes: list[str]) -> str:
    """The build's float dtype (safetensors name): its scales' or norms' dtype, else the config's, else BF16."""
    for dtype in dtypes:
        if dtype in ("BF16", "F16", "F32"):
            return dtype
    named = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
    return named.get(str(config.get("torch_dtype") or text_config(config).get("torch_dtype") or ""), "BF16")


def folder_rule(folder: Path) -> QuantRule:
    """How the build in `folder` is quantized (bits, group, dtype), from its config and headers."""
    config = json.loads((Path(folder) / "config.json").read_text())
    bits, group = build_quantization(config)
    dtypes: list[str] = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        try:
            info = read_safetensors_header(path).info
        except (OSError, SafetensorsError):
            continue
        dtypes += [i.dtype for name, i in info.items() if name.endswith((".scales", "norm.weight"))]
        if dtypes:
            break
    return QuantRule(bits=bits, group_size=group, dtype=build_dtype(config, dtypes), moe=bool(text_config(config).get("num_experts")))


def record_rule(record: HubModelRecord) -> QuantRule:
    bits, group = build_quantization(record.config)
    dtypes = [t.dtype for t in record.tensors if t.role is TensorRole.LANGUAGE and t.name.endswith((".scales", "norm.weight"))]
    return QuantRule(bits=bits, group_size=group, dtype=build_dtype(record.config, dtypes), moe=bool(text_config(record.config).get("num_experts")))


# --- the original repo ---------------------------------------------------------------------------------------------
def source_repo_for(build_repo: str | None, folder: Path | None = None) -> str | None:
    """The original Qwen repo a build was converted from: the catalog's row (Qwen/<name>), else the card's
    ``base_model`` (README.md in the folder, or the build's cached hub record), else None. Never the network."""
    for entry in catalog.builtin_catalog():
        if any(b.repo.lower() == (build_repo or "").lower() for b in entry.builds.values()):
            return entry.base_repo
    if folder is not None:
        try:
            found = readme_base_model((Path(folder) / "README.md").read_text())
        except OSError:
            found = None
        if found and found.lower() != (build_repo or "").lower():
            return found
    record = cached_record(build_repo) if build_repo else None
    if record is not None and record.base_model and record.base_model.lower() != (build_repo or "").lower():
        return record.base_model
    return None


def quantized_bytes(record: HubModelRecord, rule: QuantRule) -> int:
    """Bytes of the source's MTP head once quantized by `rule` (what the side file will hold)."""
    return sum(rule.stored_bytes(t.name, t.shape) if t.shape else t.nbytes for t in record.role_tensors(TensorRole.MTP))


def _from_source(source: str | None, rule: QuantRule, record: HubModelRecord | None, card_read: bool) -> MtpStatus:
    if source is None and card_read:
        return MtpStatus(MtpWhere.NONE, note="no original repo is known for this build (its card names no base_model)")
    if source is None:
        return MtpStatus(MtpWhere.UNKNOWN, note="the original repo is not known until the build's card is read (`qwen-desk download <build> --mtp`)")
    if record is None:
        return MtpStatus(
            MtpWhere.UNKNOWN, source_repo=source, note=f"not known until {source}'s headers are read (`qwen-desk download <build> --mtp --dry-run`)"
        )
    if not record.headers_read:
        return MtpStatus(MtpWhere.UNKNOWN, source_repo=source, note=f"{source}'s headers could not be read: {record.headers_error}")
    if not record.has_mtp:
        return MtpStatus(MtpWhere.NONE, source_repo=source, note=f"{source} has no mtp.* tensors")
    return MtpStatus(MtpWhere.TO_FETCH, head_bytes=quantized_bytes(record, rule), fetch_bytes=record.mtp_bytes, source_repo=source)


def folder_status(folder: Path, repo: str | None = None, source_record: HubModelRecord | None = None) -> MtpStatus:
    """A build on disk: in its shards, fetched beside it, or what the original repo's (cached) record says."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    own = folder_mtp_bytes(folder)
    if own:
        return MtpStatus(MtpWhere.IN_BUILD, head_bytes=own, note="in the build's own files")
    side = side_file_bytes(folder)
    if side:
        return MtpStatus(MtpWhere.FETCHED, head_bytes=side, note=f"fetched beside the build ({mtp_side_file(folder)})")
    if model_has_mtp(config) is False:
        return MtpStatus(MtpWhere.NONE, note="its config has no MTP layers (mtp_num_hidden_layers 0)")
    source = source_repo_for(repo, folder)
    card_read = (folder / "README.md").is_file() or cached_record(repo) is not None
    return _from_source(source, folder_rule(folder), source_record or cached_record(source), card_read)


def hub_status(build: HubModelRecord, source_record: HubModelRecord | None = None) -> MtpStatus:
    """A build not downloaded: its hub record says whether its shards hold the head; else the original repo's."""
    if build.has_mtp:
        return MtpStatus(MtpWhere.IN_BUILD, head_bytes=build.mtp_bytes, note="in the build's own files")
    if model_has_mtp(build.config) is False:
        return MtpStatus(MtpWhere.NONE, note="its config has no MTP layers (mtp_num_hidden_layers 0)")
    source = source_repo_for(build.repo)
    return _from_source(source, record_rule(build), source_record or cached_record(source), card_read=True)


def status_for(repo: str | None, folder: Path | None) -> MtpStatus:
    """From what is on this machine only (files, cached records): never the network, so fine on a GUI thread."""
    if folder is not None and (Path(folder) / "config.json").is_file():
        return folder_status(Path(folder), repo)
    build = cached_record(repo)
    if build is None:
        source = source_repo_for(repo)
        return MtpStatus(MtpWhere.UNKNOWN, source_repo=source, note="not known until the build's files are read")
    return hub_status(build)
