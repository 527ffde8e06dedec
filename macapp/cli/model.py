"""The model a command runs (`qwen-desk chat`, `qwen-desk serve`): its flags, their checks, and loading it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from macapp.cli import UsageError
from macapp.cli.fit import parse_context
from macapp.core import events as ev
from macapp.core.context_limit import ContextError, check_context, longest_context

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
    """UsageError for a --context too small to hold a turn or above the model's maximum (before anything is loaded)."""
    if args.context is None:
        return
    if args.context < MIN_CONTEXT:
        raise UsageError(f"--context must be at least {MIN_CONTEXT} tokens")
    located = _local_config(getattr(args, "model", None))
    if located is None:
        return  # not on this machine: the load says so
    name, config = located
    try:
        check_context(args.context, longest_context(config), name)
    except ContextError as exc:
        raise UsageError(f"--context: {exc}") from None


def _local_config(spec: str | None) -> tuple[str, dict] | None:
    """(display name, config.json) of the folder `spec` names on this machine, reading nothing else."""
    from macapp.core.engine import EngineError
    from macapp.core.engine.model_folder import display_name, locate_model

    try:
        folder = locate_model(spec or "")
        config = json.loads((folder / "config.json").read_text())
    except (EngineError, OSError, ValueError):
        return None
    return (display_name(folder), config) if isinstance(config, dict) else None


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
