"""The app's own memory use: process RSS, plus MLX's active/peak memory once MLX has been imported."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    import mlx.nn as nn


@dataclass(frozen=True)
class AppMemory:
    rss_bytes: int
    mlx_active_bytes: int | None  # None until MLX is loaded (we never import it just to ask)
    mlx_peak_bytes: int | None


def app_memory() -> AppMemory:
    rss = psutil.Process(os.getpid()).memory_info().rss
    mx = sys.modules.get("mlx.core")
    active = peak = None
    if mx is not None:
        try:
            active = int(mx.get_active_memory())
            peak = int(mx.get_peak_memory())
        except (AttributeError, RuntimeError):
            active = peak = None
    return AppMemory(rss_bytes=int(rss), mlx_active_bytes=active, mlx_peak_bytes=peak)


def parameter_bytes(module: "nn.Module") -> int:
    """The bytes of an MLX module's parameters."""
    from mlx.utils import tree_flatten

    flat = tree_flatten(module.parameters())
    return int(sum(v.nbytes for v in (flat.values() if isinstance(flat, dict) else (v for _, v in flat))))


def format_bytes(n: int | float | None) -> str:
    """1.2 GB / 850 MB / 12 KB, decimal units like Finder."""
    if n is None:
        return "—"
    n = float(n)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{int(n)} B"
