"""The Qwen3.5 catalog: built-in rows (resources/catalog.json), hub refreshes, and resolving what a user names."""

from __future__ import annotations

import difflib
import enum
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NotRequired, TypedDict

from macapp.core import paths
from macapp.core.context_limit import ContextError, longest_context, rope_of
from macapp.core.hub.errors import DownloadError, DownloadErrorKind
from macapp.core.hub.settings import hub_cache_dir
from macapp.core.hub.record import HubModelRecord, cached_record, record_for, refresh_records
from macapp.core.hub.settings import hub_reachable, hub_settings
from macapp.core.jsonvalue import JSONObject, JSONValue
from macapp.core.modelfiles import read_safetensors_header, text_config
from macapp.core.tensor_roles import loaded_by_mlx_lm, tied_embeddings

SUPPORTED_MODEL_TYPES = {"qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"}
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class ConfigError(ValueError):
    """A config.json that is missing fields or holds values that make no sense."""


class UnknownModel(LookupError):
    """A model name, repo id or folder that cannot be resolved; the message suggests what to do."""


@dataclass(frozen=True)
class Arch:
    """The text-model fields the sizing model needs, read from a Qwen3.5 config."""

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    full_attention_interval: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    vocab_size: int
    max_position_embeddings: int  # the longest context the app runs it at: past the native length with YaRN
    tie_word_embeddings: bool
    intermediate_size: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    native_context: int = 0  # the config's native length (0: not known, taken as max_position_embeddings)
    no_yarn_reason: str | None = None  # why long-context mode (YaRN) cannot extend it, if it cannot

    @property
    def native(self) -> int:
        return self.native_context or self.max_position_embeddings

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def full_attention_layers(self) -> int:
        # mlx-lm decides by the interval (layer i is full attention when (i+1) % interval == 0).
        return self.num_hidden_layers // self.full_attention_interval

    @property
    def linear_layers(self) -> int:
        return self.num_hidden_layers - self.full_attention_layers

    @classmethod
    def from_config(cls, config: JSONValue) -> "Arch":
        """Read a config.json (top level or its nested `text_config`); raise ConfigError on missing or nonsense fields."""
        if not isinstance(config, dict):
            raise ConfigError("config.json is not a JSON object")
        text = text_config(config)
        model_type = str(text.get("model_type") or config.get("model_type") or "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"model_type {model_type or '(missing)'!r} is not a Qwen3.5 model (expected one of {', '.join(sorted(SUPPORTED_MODEL_TYPES))})")
        hidden = _positive(text, "hidden_size")
        heads = _positive(text, "num_attention_heads")
        head_dim = text.get("head_dim") or hidden // heads
        fields = dict(
            hidden_size=hidden,
            num_hidden_layers=_positive(text, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=_positive(text, "num_key_value_heads"),
            head_dim=_positive({"head_dim": head_dim}, "head_dim"),
            full_attention_interval=_positive(text, "full_attention_interval", default=4),
            linear_num_key_heads=_positive(text, "linear_num_key_heads"),
            linear_num_value_heads=_positive(text, "linear_num_value_heads"),
            linear_key_head_dim=_positive(text, "linear_key_head_dim"),
            linear_value_head_dim=_positive(text, "linear_value_head_dim"),
            linear_conv_kernel_dim=_positive(text, "linear_conv_kernel_dim", default=4),
            vocab_size=_positive(text, "vocab_size"),
            max_position_embeddings=_longest_context(text),
            native_context=rope_of(text).native,
        )
        rope = rope_of(text)
        tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
        if fields["num_key_value_heads"] > heads:
            raise ConfigError(f"num_key_value_heads ({fields['num_key_value_heads']}) exceeds num_attention_heads ({heads})")
        experts = _non_negative(text, "num_experts")
        if experts:
            fields.update(
                num_experts=experts,
                num_experts_per_tok=_positive(text, "num_experts_per_tok"),
                moe_intermediate_size=_positive(text, "moe_intermediate_size"),
                shared_expert_intermediate_size=_non_negative(text, "shared_expert_intermediate_size"),
            )
            if fields["num_experts_per_tok"] > experts:
                raise ConfigError(f"num_experts_per_tok ({fields['num_experts_per_tok']}) exceeds num_experts ({experts})")
        else:
            fields["intermediate_size"] = _positive(text, "intermediate_size")
        return cls(model_type=model_type, tie_word_embeddings=tied, no_yarn_reason=rope.no_yarn_reason, **fields)


def _positive(source: JSONObject, key: str, default: int | None = None) -> int:
    value = source.get(key, default)
    if value is None:
        raise ConfigError(f"config field {key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value <= 0:
        raise ConfigError(f"config field {key!r} must be a positive whole number, not {value!r}")
    return int(value)


def _longest_context(config: JSONObject) -> int:
    try:
        return longest_context(config)
    except ContextError as exc:
        raise ConfigError(str(exc)) from None


def _non_negative(source: JSONObject, key: str) -> int:
    value = source.get(key) or 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
        raise ConfigError(f"config field {key!r} must be a whole number ≥ 0, not {value!r}")
    return int(value)


def quantization_of(config: JSONObject) -> tuple[int | None, int]:
    """(bits, group_size) from an MLX config's `quantization` block; bits None means unquantized."""
    quant = config.get("quantization") or config.get("quantization_config") or {}
    bits = quant.get("bits") if isinstance(quant, dict) else None
    group = quant.get("group_size", 64) if isinstance(quant, dict) else 64
    if bits is not None and (not isinstance(bits, (int, float)) or bits not in (2, 3, 4, 5, 6, 8)):
        raise ConfigError(f"quantization bits {bits!r} is not one MLX supports")
    if not isinstance(group, int) or group <= 0:
        raise ConfigError(f"quantization group_size {group!r} must be a positive whole number")
    return (None if bits is None else int(bits)), group


@dataclass(frozen=True)
class Build:
    """One published MLX build of a catalog model."""

    bits: int
    repo: str
    group_size: int = 64
    weights_bytes: int | None = None  # exact safetensors bytes, once learnt from the hub


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    kind: str  # "dense" | "moe"
    arch: Arch
    builds: dict[int, Build]
    source: str = ""

    @property
    def base_repo(self) -> str:
        """The original Qwen checkpoint the MLX builds were converted from (it keeps the MTP head they drop)."""
        return f"Qwen/{self.name}"

    def build(self, bits: int) -> Build:
        if bits not in self.builds:
            raise UnknownModel(f"{self.name} has no {bits}-bit MLX build (available: {', '.join(map(str, sorted(self.builds)))})")
        return self.builds[bits]


class Origin(enum.StrEnum):
    """Where a ModelRef came from."""

    CATALOG = "catalog"  # a row of resources/catalog.json
    HUB = "hub"  # a hub repo id outside the catalog
    LOCAL = "local"  # a folder on disk


@dataclass(frozen=True)
class LoadChoice:
    """How the person chose to load a model; the default is the normal load, refused when it does not fit."""

    anyway: bool = False  # "Load anyway": past a fit check that said it does not fit
    memory_budget_bytes: int | None = None  # the engine's per-message memory check then uses this (this Mac's RAM)


@dataclass(frozen=True)
class ModelRef:
    """A resolved model: what to download or load, and what the sizing model needs."""

    name: str
    arch: Arch
    bits: int | None
    group_size: int = 64
    repo: str | None = None
    local_path: Path | None = None
    weights_bytes: int | None = None  # exact bytes of the weight files when known
    origin: Origin = Origin.CATALOG
    load: LoadChoice = field(default=LoadChoice(), compare=False)


class _BuildRow(TypedDict):
    """A build in resources/catalog.json."""

    repo: str
    group_size: NotRequired[int]
    weights_bytes: NotRequired[int | None]


class _CatalogRow(TypedDict):
    """A model in resources/catalog.json (its vision_config and builds' vision flags are read by vision.builds)."""

    name: str
    kind: str
    builds: dict[str, _BuildRow]
    text_config: JSONObject
    source: NotRequired[str]


def _entry_from_json(row: _CatalogRow) -> CatalogEntry:
    builds = {
        int(bits): Build(bits=int(bits), repo=b["repo"], group_size=int(b.get("group_size", 64)), weights_bytes=b.get("weights_bytes"))
        for bits, b in row["builds"].items()
    }
    return CatalogEntry(name=row["name"], kind=row["kind"], arch=Arch.from_config(row["text_config"]), builds=builds, source=row.get("source", ""))


def builtin_catalog() -> list[CatalogEntry]:
    rows: list[_CatalogRow] = json.loads((paths.resources_dir() / "catalog.json").read_text())["models"]
    return [_entry_from_json(row) for row in rows]


def hub_endpoint() -> str | None:
    """HF_ENDPOINT as it is now, None when it is not set (macapp.core.hub.settings reads it)."""
    settings = hub_settings()
    return settings.endpoint if settings.endpoint_set else None


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as it is now, by huggingface_hub's rules (macapp.core.hub.settings)."""
    return hub_settings().offline


def _usable(record: HubModelRecord) -> bool:
    """A record whose config the sizing model can use (a bad download is not trusted over the built-in row)."""
    try:
        Arch.from_config(record.config)
        quantization_of(record.config)
        return True
    except ConfigError:
        return False


def load_catalog() -> list[CatalogEntry]:
    """The catalog: built-in rows, with exact sizes and real configs from the last hub refresh where there is one."""
    entries = []
    for entry in builtin_catalog():
        arch = entry.arch
        builds = dict(entry.builds)
        for bits, build in entry.builds.items():
            record = cached_record(build.repo)
            if record is None or not _usable(record):
                continue
            builds[bits] = replace(build, weights_bytes=record.weights_bytes, group_size=quantization_of(record.config)[1])
            arch = Arch.from_config(record.config)
        entries.append(replace(entry, arch=arch, builds=builds))
    return entries


def refresh_catalog(entries: list[CatalogEntry] | None = None) -> dict[str, str]:
    """Read each build's hub record (real config.json, exact file and tensor sizes) and cache it; returns repo → error
    for failures. The same records tell vision whether each build sees (`vision.builds`)."""
    settings = hub_settings()
    if settings.offline:
        return {"*": "HF_HUB_OFFLINE is set: using the built-in catalog"}
    if not hub_reachable():
        return {"*": f"the hub ({settings.host_label}) cannot be reached: using the built-in catalog"}
    repos = [build.repo for entry in entries or builtin_catalog() for build in entry.builds.values()]
    records, errors = refresh_records(repos)
    for repo, record in records.items():
        try:
            Arch.from_config(record.config)  # a config the sizing model cannot use is reported (and not used)
            quantization_of(record.config)
        except ConfigError as exc:
            errors[repo] = f"ConfigError: {exc}"
    return errors


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower())


def find_entry(name: str, catalog: list[CatalogEntry] | None = None) -> CatalogEntry | None:
    catalog = catalog if catalog is not None else load_catalog()
    wanted = _normalise(name)
    for entry in catalog:
        if _normalise(entry.name) == wanted:
            return entry
    return None


def _from_catalog_repo(repo: str, catalog: list[CatalogEntry]) -> ModelRef | None:
    for entry in catalog:
        for build in entry.builds.values():
            if build.repo.lower() == repo.lower():
                return model_ref(entry, build)
    return None


def model_ref(entry: CatalogEntry, build: Build) -> ModelRef:
    """The ModelRef of one build of a catalog entry (no re-read of the catalog)."""
    return ModelRef(
        name=entry.name,
        arch=entry.arch,
        bits=build.bits,
        group_size=build.group_size,
        repo=build.repo,
        weights_bytes=build.weights_bytes,
        origin=Origin.CATALOG,
    )


def weight_files_bytes(folder: Path) -> int | None:
    """Bytes of the weights mlx-lm will load from a folder: tensor sizes from the headers, vision/MTP tensors left out
    (a repo converted with its vision tower is bigger on disk than in memory); file sizes if a header is unreadable."""
    total = 0
    tied = _folder_tied(folder)
    for path in sorted(folder.glob("*.safetensors")):
        try:
            total += sum(end - start for name, (start, end) in read_safetensors_header(path).tensors.items() if loaded_by_mlx_lm(name, tied))
        except (OSError, ValueError, KeyError, TypeError):
            total += path.stat().st_size
    return total or None


def _folder_tied(folder: Path) -> bool:
    try:
        return tied_embeddings(json.loads((folder / "config.json").read_text()))
    except (OSError, ValueError, AttributeError):
        return False


def model_from_folder(folder: Path, name: str | None = None, repo: str | None = None) -> ModelRef:
    """A ModelRef for a local MLX folder (its own config.json and exact file sizes)."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise UnknownModel(f"{folder} holds no config.json: point at a folder with an MLX Qwen3.5 model")
    try:
        config = json.loads(config_path.read_text())
    except ValueError as exc:
        raise ConfigError(f"{config_path} is not valid JSON ({exc})") from None
    arch = Arch.from_config(config)
    bits, group = quantization_of(config)
    return ModelRef(
        name=name or folder.name,
        arch=arch,
        bits=bits,
        group_size=group,
        repo=repo,
        local_path=folder,
        weights_bytes=weight_files_bytes(folder),
        origin=Origin.LOCAL if repo is None else Origin.HUB,
    )


def _hub_model(repo: str) -> ModelRef:
    """A hub repo outside the catalog: from the HF cache if present, else its hub record (config + sizes)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        folder = Path(snapshot_download(repo, allow_patterns=["config.json"], local_files_only=True, cache_dir=hub_cache_dir()))
        if (folder / "config.json").is_file():
            return model_from_folder(folder, name=repo.split("/")[-1], repo=repo)
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass
    if hub_offline():
        raise UnknownModel(f"{repo} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: go online or download it first")
    if not hub_reachable():
        raise UnknownModel(f"{repo} is not in the local Hugging Face cache and the hub cannot be reached: check the connection (or HF_ENDPOINT)")
    try:
        record = record_for(repo)
    except GatedRepoError:
        raise UnknownModel(f"{repo} is gated or private: accept its licence on the hub and set HF_TOKEN (or run `hf auth login`)") from None
    except RepositoryNotFoundError:
        raise UnknownModel(f"{repo} does not exist on the hub (or is private: set HF_TOKEN)") from None
    except DownloadError as exc:
        if exc.kind in (DownloadErrorKind.GATED, DownloadErrorKind.UNAUTHORIZED):
            raise UnknownModel(f"{repo} is gated or private: accept its licence on the hub and set HF_TOKEN (or run `hf auth login`)") from None
        if exc.kind is DownloadErrorKind.NOT_FOUND:
            raise UnknownModel(f"{repo} does not exist on the hub (or is private: set HF_TOKEN)") from None
        raise UnknownModel(f"could not read {repo} from the hub ({exc}); check the connection or HF_ENDPOINT") from None
    except Exception as exc:
        raise UnknownModel(f"could not read {repo} from the hub ({type(exc).__name__}: {exc}); check the connection or HF_ENDPOINT") from None
    bits, group = quantization_of(record.config)
    return ModelRef(
        name=repo.split("/")[-1],
        arch=Arch.from_config(record.config),
        bits=bits,
        group_size=group,
        repo=repo,
        weights_bytes=record.weights_bytes,
        origin=Origin.HUB,
    )


def resolve_model(spec: str, bits: int | None = None) -> ModelRef:
    """A catalog name (case-insensitive), a hub repo id, or a local folder → ModelRef. Catalog names default to 4-bit."""
    spec = (spec or "").strip()
    if not spec:
        raise UnknownModel("no model given: name one from `qwen-desk models`, a hub repo id, or a local folder")
    if bits is not None and bits not in (4, 8):
        raise UnknownModel(f"--bits must be 4 or 8, not {bits}")
    folder = Path(spec).expanduser()
    if folder.is_dir():
        return model_from_folder(folder.resolve())
    catalog = load_catalog()
    entry = find_entry(re.sub(r"-(4|8)bit$", "", spec, flags=re.I), catalog)
    if entry is not None:
        suffix = re.search(r"-(4|8)bit$", spec, flags=re.I)
        chosen = bits or (int(suffix.group(1)) if suffix else 4)
        return model_ref(entry, entry.build(chosen))
    if REPO_ID.match(spec):
        known = _from_catalog_repo(spec, catalog)
        if known is not None:
            return known
        return _hub_model(spec)
    if "/" in spec or spec.startswith((".", "~")):
        raise UnknownModel(f"{spec} is not a folder on this machine")
    names = [e.name for e in catalog]
    by_lower = {n.lower(): n for n in names}
    wanted = spec.lower()
    close = [n for low, n in by_lower.items() if low.startswith(wanted) or wanted in low]
    close += [by_lower[c] for c in difflib.get_close_matches(wanted, list(by_lower), n=3, cutoff=0.5) if by_lower[c] not in close]
    close = close[:3]
    hint = f" Did you mean {', '.join(close)}?" if close else f" Known models: {', '.join(names)}."
    raise UnknownModel(f"unknown model {spec!r}.{hint}")
