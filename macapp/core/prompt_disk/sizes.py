"""The disk store's size: `--prompt-cache-disk SIZE` as written, its default, and the free space it leaves."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

DEFAULT_MAX_BYTES = 20 * 10**9  # at most 20 GB ...
FREE_SHARE = 10  # ... and at most a tenth of the disk's free space
FLOOR_BYTES = 2 * 10**9  # writing stops when the disk would have less free than this

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9, "T": 10**12, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


SETTING = "prompt_cache.disk"  # the window's setting: a size as --prompt-cache-disk takes it, "" for the default


class SizeError(ValueError):
    """A size that cannot be read; the message says how to write one."""


def parse_size(text: str) -> int:
    """'8MB', '20 GB', '512MiB', '0' (off), a plain number of bytes → bytes. MB and GB are decimal (disk sizes)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise SizeError(f"cannot read the size {text!r}: write it like 20GB, 512MB or 0 (off)")
    return int(float(match.group(1)) * _UNITS[unit])


def setting_bytes(value: object) -> int | None:
    """The window's SETTING as bytes: None (the default size) when unset or not a size (the dialog refuses those)."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return parse_size(value)
    except SizeError:
        return None


def default_bytes(folder: Path) -> int:
    """The smaller of 20 GB and a tenth of the free space on the disk that holds `folder`."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return 0
    return min(DEFAULT_MAX_BYTES, free // FREE_SHARE)


def describe(nbytes: int) -> str:
    """Bytes as people read disk sizes: '8.0 MB', '12.4 GB'."""
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"
