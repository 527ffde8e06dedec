"""The model a command runs (`qwen-desk chat`, `qwen-desk serve`): its flags, their checks, and loading it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from macapp.cli import UsageError
from macapp.cli.fit import parse_context
from macapp.core import events as ev

# A load that fails for one of these is the user's to fix (exit 2, the message as it is); anything else exits 1.
LOAD_CODES = (ev.NOT_FOUND, ev.NOT_A_MODEL, ev.CORRUPT, ev.CANCELLED)
MIN_CONTEXT = 16


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", required=True, help="model folder, downloaded hub repo id, or catalog name")


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """--context and --kv-bits: how large the prompt cache may grow, and whether it is quantized."""
    parser.add_argument("--context", type=parse_context, metavar="TOKENS", help="context limit, e.g. 32768 or 128k (default: the model's maximum)")
    parser.add_argument("--kv-bits", type=int, choices=(4, 8), help="quantize the KV cache")


def check_cache_arguments(args: argparse.Namespace) -> None:
    """UsageError for a --context too small to hold a turn (before anything is loaded)."""
    if args.context is not None and args.context < MIN_CONTEXT:
        raise UsageError(f"--context must be at least {MIN_CONTEXT} tokens")


def load_model(engine: Any, spec: str) -> ev.Loaded | None:
    """Load `spec` on the engine and return its Loaded event. A model that cannot be found or read raises
    UsageError; any other failure is printed to stderr and gives None (the command exits 1)."""
    from macapp.core.engine import EngineError

    try:
        return engine.load(spec).result()
    except EngineError as exc:
        if exc.code in LOAD_CODES:
            raise UsageError(exc.message) from exc
        print(f"qwen-desk: {exc.message}", file=sys.stderr)
        return None
