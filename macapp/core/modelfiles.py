"""Reading a model folder's files without loading them: the text settings of config.json, safetensors headers.

Shared by the catalog (sizes, architecture) and the engine (checking a folder before loading it). Pure: no MLX.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from macapp.core.jsonvalue import JSONObject


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's settings: config.json's nested `text_config` (multimodal checkpoints), else its top level."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


class SafetensorsError(ValueError):
    """A safetensors file whose header cannot be read; the message says why."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in a safetensors header."""

    dtype: str  # the safetensors dtype name: "BF16", "F32", "U32", ...
    shape: tuple[int, ...]
    start: int  # byte offsets after the header
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SafetensorsHeader:
    header_bytes: int  # the 8-byte length plus the JSON header
    tensors: dict[str, tuple[int, int]]  # tensor name -> (start, end) byte offsets after the header
    metadata: JSONObject
    info: dict[str, TensorInfo] = field(default_factory=dict, compare=False)  # name -> dtype, shape, offsets

    @property
    def data_bytes(self) -> int:
        """Bytes the tensors need after the header (the end of the last one)."""
        return max((end for _, end in self.tensors.values()), default=0)


def header_length(first8: bytes, file_size: int | None = None) -> int:
    """The JSON header's length from a safetensors file's first 8 bytes; SafetensorsError when it cannot be."""
    if len(first8) < 8:
        raise SafetensorsError("too short")
    n = int.from_bytes(first8[:8], "little")
    if n <= 0 or (file_size is not None and 8 + n > file_size):
        raise SafetensorsError("bad header length")
    return n


def parse_safetensors_header(raw: bytes) -> SafetensorsHeader:
    """A header from its JSON bytes (the n bytes after the 8-byte length); SafetensorsError when unreadable."""
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise SafetensorsError(f"unreadable header: {exc}") from exc
    if not isinstance(header, dict):
        raise SafetensorsError("bad header")
    tensors: dict[str, tuple[int, int]] = {}
    info: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = (int(x) for x in meta["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"bad entry for {name}") from None
        tensors[name] = (start, end)
        shape = meta.get("shape") if isinstance(meta.get("shape"), list) else []
        info[name] = TensorInfo(str(meta.get("dtype", "")), tuple(int(d) for d in shape), start, end)
    metadata = header.get("__metadata__")
    return SafetensorsHeader(8 + len(raw), tensors, metadata if isinstance(metadata, dict) else {}, info)


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """The header of a .safetensors file (8-byte little-endian length, then JSON); SafetensorsError or OSError."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        n = header_length(f.read(8), size)
        return parse_safetensors_header(f.read(n))


def safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file cannot be whole (truncated, bad header), or None; reads only its header."""
    try:
        size = path.stat().st_size
        header = read_safetensors_header(path)
    except SafetensorsError as exc:
        return str(exc)
    except OSError as exc:
        return f"unreadable header: {exc}"
    need = header.header_bytes + header.data_bytes
    if need > size:
        return f"truncated: {size:,} bytes of {need:,}"
    return None


MTP_PREFIX = "mtp."  # the multi-token-prediction head's tensors in a Qwen3.5 checkpoint (mlx-lm's sanitize drops them)


def mtp_side_file(model_dir: Path) -> Path:
    """Where the MTP head fetched for a build that lacks it is kept: beside the build, never inside its folder.

    Inside it would be read as weights: mlx-vlm loads every `*.safetensors` of a folder and takes `mtp.*` keys as
    the sign of an unconverted checkpoint (it then re-lays the conv weights). So for a snapshot in the HF cache
    (`models--org--name/snapshots/<rev>`) it is `models--org--name/qwen-desk/mtp-<rev>.safetensors` (deleted with
    the repo); for any other folder `<parent>/.<folder name>.qwen-desk-mtp.safetensors`.
    """
    model_dir = Path(model_dir)
    if model_dir.parent.name == "snapshots" and model_dir.parent.parent.name.startswith("models--"):
        return model_dir.parent.parent / "qwen-desk" / f"mtp-{model_dir.name}.safetensors"
    return model_dir.parent / f".{model_dir.name}.qwen-desk-mtp.safetensors"
