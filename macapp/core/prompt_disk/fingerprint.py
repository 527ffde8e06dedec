"""What produced a checkpoint: two models (or settings) with another fingerprint never share one.

Everything a cache's contents depend on: the weights (each safetensors file's name, size, modification time and
header, which names every tensor, its dtype, shape and offsets), the config the model runs with (quantization,
rope and YaRN as loaded), the tokenizer and chat template files, the KV cache quantization, the MTP head (its file
and depth), and the MLX, mlx-lm and mlx-vlm versions. Reading the headers costs a few kilobytes per file, not the
weights.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from macapp.core.modelfiles import header_length

if TYPE_CHECKING:
    from macapp.core.engine.model_folder import LoadedModel
    from macapp.core.engine.options import KVQuantization

TEXT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json", "generation_config.json")
PACKAGES = ("mlx", "mlx-lm", "mlx-vlm")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def _file(h: "hashlib._Hash", path: Path, header_only: bool) -> None:
    try:
        st = path.stat()
        with open(path, "rb") as f:
            if header_only:
                first8 = f.read(8)
                data = first8 + f.read(header_length(first8, st.st_size))
            else:
                data = f.read()
    except Exception as exc:  # an unreadable file still changes the fingerprint, and never matches a readable one
        data = f"unreadable: {exc}".encode()
        st = None
    h.update(f"{path.name}\0{st.st_size if st else -1}\0{st.st_mtime_ns if st else -1}\0".encode())
    h.update(hashlib.sha256(data).digest())


def folder_fingerprint(folder: Path, extra: dict[str, object]) -> str:
    """The fingerprint of the model in `folder` run with `extra` (settings that change the cache)."""
    h = hashlib.sha256(b"qwen-desk prompt cache 1\0")
    for path in sorted(Path(folder).glob("*.safetensors")):
        _file(h, path, header_only=True)
    for name in TEXT_FILES:
        if (Path(folder) / name).is_file():
            _file(h, Path(folder) / name, header_only=False)
    h.update(json.dumps({"versions": {p: _version(p) for p in PACKAGES}, **extra}, sort_keys=True, default=str).encode())
    return h.hexdigest()


def fingerprint(model: "LoadedModel", kv: "KVQuantization") -> str:
    """The fingerprint of `model` as loaded, its cache quantized as `kv` says."""
    head = model.mtp_head
    extra: dict[str, object] = {
        "config": model.config,  # as run: YaRN applied in memory (model_folder.configured_for)
        "kv": [kv.bits, kv.group_size, kv.start] if kv.bits else None,
        "mtp": None,
    }
    if head is not None:
        h = hashlib.sha256()
        _file(h, Path(head.source), header_only=True)
        extra["mtp"] = [str(head.source), head.depth, h.hexdigest()]
    return folder_fingerprint(model.path, extra)
