"""`qwen-desk history` (being built)."""

from __future__ import annotations


def register(subparsers) -> None:
    subparsers.add_parser("history", help="(not built yet)").set_defaults(func=lambda args: 1)
