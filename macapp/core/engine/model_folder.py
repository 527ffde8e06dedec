"""Finding a model folder, checking it before anything is let go of, and loading it with mlx-lm."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Collection, Literal, Mapping, Protocol, Sequence, overload

from macapp.core import events as ev
from macapp.core.catalog import REPO_ID, SUPPORTED_MODEL_TYPES, Arch, resolve_model
from macapp.core import long_context
from macapp.core.hub.settings import hub_cache_dir
from macapp.core.jsonvalue import JSONObject
from macapp.core.memory import parameter_bytes
from macapp.core.long_context import yarn_longest
from macapp.core.context_limit import ContextError, check_config_context, rope_of
from macapp.core.engine.errors import EngineError
from macapp.core.engine.mtp_head import MTPHead, load_mtp_head
from macapp.core.engine.options import MTPMode
from macapp.core.events import Loaded
from macapp.core.modelfiles import safetensors_problem, text_config
from macapp.core.vision.tower import TowerSlot

if TYPE_CHECKING:  # naming MLX's and mlx-lm's types costs nothing at start-up
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper


class Detokenizer(Protocol):
    """mlx-lm's streaming detokenizer as the runtime uses it: one token in, the text it completes out."""

    def add_token(self, token: int) -> None: ...
    def finalize(self) -> None: ...
    @property
    def last_segment(self) -> str: ...


class Tokenizer(Protocol):
    """What the runtime and the API read of a model's tokenizer: mlx-lm's TokenizerWrapper (which hands the rest
    to the Hugging Face tokenizer it wraps), or a Hugging Face tokenizer where no reply is streamed."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, tokens: Sequence[int]) -> str: ...
    def convert_tokens_to_ids(self, token: str) -> int: ...
    def get_vocab(self) -> dict[str, int]: ...
    @overload
    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, object]],
        *,
        tools: Sequence[Mapping[str, object]] | None = ...,
        add_generation_prompt: bool = ...,
        enable_thinking: bool = ...,
        tokenize: Literal[True] = ...,
    ) -> list[int]: ...
    @overload
    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, object]],
        *,
        tools: Sequence[Mapping[str, object]] | None = ...,
        add_generation_prompt: bool = ...,
        enable_thinking: bool = ...,
        tokenize: Literal[False],
    ) -> str: ...
    @property
    def has_thinking(self) -> bool: ...
    @property
    def eos_token_ids(self) -> Collection[int]: ...
    @property
    def detokenizer(self) -> Detokenizer: ...  # a fresh one per read (mlx-lm's TokenizerWrapper)


@dataclass
class LoadedModel:
    """The loaded model as the worker holds it; read it only from work running on the worker (Engine.submit)."""

    model: "nn.Module"  # mlx-lm's model, or a ModelProxy passing for it (macapp.core.cluster: calls run on several Macs)
    tokenizer: "TokenizerWrapper"  # as mlx-lm's load gives it (a Tokenizer)
    config: JSONObject
    path: Path
    info: Loaded
    arch: Arch | None  # None: the config could not be sized (no memory check)
    im_end_id: int | None
    think_end_id: int | None
    weights_bytes: int
    mtp_head: MTPHead | None = None  # when the build has a usable MTP head (and --mtp is not off)
    mtp_problem: str = ""  # why a head that is there could not be used
    tower: TowerSlot = field(default_factory=TowerSlot, compare=False, repr=False)  # the vision tower, once a picture needs it


def _rope(config: JSONObject, path: Path) -> long_context.RopeInfo:
    try:
        return rope_of(config)
    except ContextError as exc:
        raise EngineError(f"{path}: {exc}.", ev.NOT_A_MODEL) from exc


def configured_for(config: JSONObject, path: Path, context: int | None) -> tuple[JSONObject, int | None]:
    """The config a model runs with at `context` (in memory: YaRN past the native length) and the YaRN factor
    (None at or below native); EngineError for a context the model cannot take."""
    factor = yarn_for(config, path, context)
    if not factor:
        return config, None
    return long_context.with_yarn(config, factor, _rope(config, path).native), factor


def long_context_mode(model: "nn.Module", config: JSONObject, factor: int | None) -> None:
    """A model just read, set to run as loaded: YaRN on its rope layers when `factor` (with_yarn's config), and
    prompts read in blocks of queries. Rank 0 and the followers of several Macs run this same step."""
    if factor:
        long_context.use_yarn(model, config)
    long_context.install_blocked_attention()


def yarn_for(config: JSONObject, path: Path, context: int | None) -> int | None:
    """The YaRN factor to load `config` with for a `context`-token limit (None: its own rope); EngineError
    (CONTEXT_LIMIT) for a context the model cannot take."""
    info = _rope(config, path)
    if context is None or context <= info.native:
        return None
    try:
        check_config_context(context, config, display_name(path))
        return long_context.factor_for(info, context)
    except (ContextError, long_context.NoYarn) as exc:
        raise EngineError(f"{exc}.", ev.CONTEXT_LIMIT) from exc


def locate_model(spec: str) -> Path:
    """A local folder, or the downloaded snapshot of a hub repo id or catalog name; EngineError otherwise."""
    spec = (spec or "").strip()
    if not spec:
        raise EngineError("No model given: pass a model folder or a downloaded repo id.", ev.NOT_FOUND)
    folder = Path(spec).expanduser()
    if folder.is_dir():
        return folder.resolve()
    if folder.exists():
        raise EngineError(f"{spec} is a file, not a model folder.", ev.NOT_A_MODEL)
    looks_like_path = spec.startswith((".", "~", os.sep)) or spec.count("/") > 1 or (os.sep != "/" and os.sep in spec)
    if looks_like_path:
        raise EngineError(f"No model folder at {spec}.", ev.NOT_FOUND)
    repo = spec
    if not REPO_ID.match(spec):
        try:
            ref = resolve_model(spec)
        except Exception as exc:
            raise EngineError(f"No model folder at {spec}, and it is not a known model name ({exc}).", ev.NOT_FOUND) from exc
        if ref.local_path is not None:
            return Path(ref.local_path)
        repo = ref.repo or spec
    try:
        from huggingface_hub import snapshot_download

        # hub_cache_dir reads HF_HOME / HF_HUB_CACHE now; huggingface_hub's own default was read at its import
        return Path(snapshot_download(repo, local_files_only=True, cache_dir=str(hub_cache_dir())))
    except Exception as exc:
        raise EngineError(
            f"{repo} is not downloaded yet: run `qwen-desk download {repo}` first (or pass a model folder).",
            ev.NOT_FOUND,
        ) from exc


def check_model_folder(path: Path) -> JSONObject:
    """The folder's config.json if it looks like a Qwen3.5-family MLX model; EngineError with the reason otherwise."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise EngineError(f"{path} is not a model folder: it has no config.json.", ev.NOT_A_MODEL)
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise EngineError(f"{config_file} is damaged ({exc}); download the model again.", ev.CORRUPT) from exc
    if not isinstance(config, dict):
        raise EngineError(f"{config_file} is damaged (not a JSON object); download the model again.", ev.CORRUPT)
    model_type = config.get("model_type") or text_config(config).get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise EngineError(
            f"{path.name} is not a Qwen3.5-family model (model_type {model_type!r}); Qwen Desk runs qwen3_5 and qwen3_5_moe models.",
            ev.NOT_A_MODEL,
        )
    weight_files = sorted(path.glob("model*.safetensors"))
    if not weight_files:
        raise EngineError(f"{path} has no weights (model*.safetensors); download the model again.", ev.CORRUPT)
    for weight_file in weight_files:
        problem = safetensors_problem(weight_file)
        if problem:
            raise EngineError(f"{weight_file.name} in {path} is damaged ({problem}); download the model again.", ev.CORRUPT)
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise EngineError(f"{path} has no tokenizer files; download the model again.", ev.CORRUPT)
    return config


def display_name(path: Path) -> str:
    """The folder's name, or the repo id of a Hugging Face cache snapshot (…/models--org--name/snapshots/<rev>)."""
    if path.parent.name == "snapshots":
        return path.parent.parent.name.removeprefix("models--").replace("--", "/")
    return path.name


ModelReader = Callable[[Path], tuple["nn.Module", "TokenizerWrapper", JSONObject]]  # folder -> (model, tokenizer, config as loaded)


def read_with_mlx_lm(path: Path) -> tuple["nn.Module", "TokenizerWrapper", JSONObject]:
    import mlx_lm

    loaded = mlx_lm.load(str(path), return_config=True)
    if len(loaded) != 3:  # return_config=True: (model, tokenizer, config)
        raise ValueError("mlx-lm's load gave no config")
    return loaded


def load_model(
    path: Path,
    config: JSONObject,
    read: ModelReader = read_with_mlx_lm,
    context: int | None = None,
    mtp: MTPMode = MTPMode.AUTO,
) -> LoadedModel:
    """Read a model folder already found by locate_model and checked by check_model_folder (its config).
    `read` does the reading (the engine's hook: macapp.core.cluster reads a shard and wraps the model).
    A `context` past the native length loads it in long-context mode (YaRN, macapp.core.long_context): the
    loaded model's rope and its config in memory change, the folder's config.json does not. `mtp` off: the
    build's MTP head is not read at all (no memory for it, `mtp_head` None)."""
    import mlx.core as mx

    rope = _rope(config, path)
    config, factor = configured_for(config, path, context)
    mx.clear_cache()
    before = mx.get_active_memory()
    start = time.perf_counter()
    try:
        model, tokenizer, loaded_config = read(path)
    except EngineError:
        raise  # a reader's own clear message (several Macs: another rank lost, different files)
    except Exception as exc:
        raise EngineError(f"Could not read the model in {path}: {exc}. The files may be damaged; download it again.", ev.CORRUPT) from exc
    long_context_mode(model, config, factor)
    head, problem = _mtp_head(model, config, path) if read is read_with_mlx_lm and mtp is not MTPMode.OFF else (None, "")
    load_time = time.perf_counter() - start
    weights = parameter_bytes(model)
    quant = loaded_config.get("quantization")
    bits = quant.get("bits") if isinstance(quant, dict) else None
    try:
        arch: Arch | None = Arch.from_config(config)
    except Exception:  # sizing is then skipped (no memory check), the model still runs
        arch = None
    vocab = tokenizer.get_vocab()
    info = Loaded(
        path=str(path),
        name=display_name(path),
        model_type=str(config.get("model_type")),
        load_time_s=load_time,
        memory_bytes=int(mx.get_active_memory() - before),
        weights_bytes=weights,
        bits=bits if isinstance(bits, int) else None,
        # as loaded: the native length, or the YaRN limit in long-context mode (reloading changes it)
        max_context=yarn_longest(rope.native, factor) if factor else (rope.longest if rope.configured_factor else rope.native),
        has_thinking=bool(tokenizer.has_thinking),
        native_context=rope.native,
        yarn_factor=factor or rope.configured_factor,
        mtp_head_bytes=head.nbytes if head is not None else 0,
    )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        path=path,
        info=info,
        arch=arch,
        im_end_id=vocab.get("<|im_end|>"),
        think_end_id=vocab.get("</think>"),
        weights_bytes=weights,
        mtp_head=head,
        mtp_problem=problem,
    )


@dataclass
class _HeadTarget:
    """What load_mtp_head reads of a model being loaded (mtp_head.HeadTarget)."""

    model: "nn.Module"
    config: JSONObject
    path: Path


def _mtp_head(model: "nn.Module", config: JSONObject, path: Path) -> tuple[MTPHead | None, str]:
    """The build's MTP head bound to `model` (mtp_head.load_mtp_head), or None and why a head that is there is
    unusable ("" when there is none). Only for mlx-lm's own model: a cluster's shard has no head to run."""
    try:
        return load_mtp_head(_HeadTarget(model, config, path), path), ""
    except Exception as exc:  # a damaged or mismatched head: plain decoding, and "--mtp on" says why
        return None, str(exc)
