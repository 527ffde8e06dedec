"""`qwen-desk download` (being built)."""

from __future__ import annotations


def register(subparsers) -> None:
    subparsers.add_parser("download", help="(not built yet)").set_defaults(func=lambda args: 1)
