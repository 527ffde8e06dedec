"""`qwen-desk chat` (being built)."""

from __future__ import annotations


def register(subparsers) -> None:
    subparsers.add_parser("chat", help="(not built yet)").set_defaults(func=lambda args: 1)
