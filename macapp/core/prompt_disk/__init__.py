"""Prompt checkpoints on disk, so agent sessions and reopened conversations start warm, after a restart too.

The API's pool (macapp.core.serving.pool) keeps checkpoints in memory; this store keeps them on disk as well,
under `<app home>/cache/prompts/` (store.py), one safetensors file per checkpoint (entry.py), keyed by the digest
of its tokens (keys.py) in a folder per fingerprint of what produced it (fingerprint.py), bounded in bytes
(sizes.py). Qt-free; MLX is imported only where arrays are read or written.
"""

from macapp.core.prompt_disk.sizes import SETTING, SizeError, default_bytes, describe, parse_size, setting_bytes
from macapp.core.prompt_disk.store import DiskStore, FolderSummary, prompts_dir

__all__ = ["SETTING", "DiskStore", "FolderSummary", "SizeError", "default_bytes", "describe", "parse_size", "prompts_dir", "setting_bytes"]
