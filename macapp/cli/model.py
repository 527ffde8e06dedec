"""The model a command runs (`qwen-desk chat`, `qwen-desk serve`): its flags, their checks, and loading it."""

from __future__ import annotations

import argparse
import json
import sys

from macapp.cli import UsageError
from macapp.cli.fit import parse_context
from macapp.core import events as ev
from macapp.core import long_context
from macapp.core.context_limit import ContextError, check_config_context
from macapp.core.engine import Engine, EngineError
from macapp.core.engine.model_folder import display_name, locate_model
from macapp.core.engine.options import MTPMode
from macapp.core.jsonvalue import JSONObject

# A load that fails for one of these is the user's to fix (exit 2, the message as it is); anything else exits 1.
LOAD_CODES = (ev.NOT_FOUND, ev.NOT_A_MODEL, ev.CORRUPT, ev.CANCELLED, ev.CONTEXT_LIMIT)
MIN_CONTEXT = 16


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", required=True, help="model folder, downloaded hub repo id, or catalog name")


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """--context and --kv-bits: how large the prompt cache may grow, and whether it is quantized."""
    parser.add_argument(
        "--context",
        type=parse_context,
        metavar="TOKENS",
        help="context limit, e.g. 32768, 128k or 1m (default: the model's native maximum; past it, YaRN long-context mode)",
    )
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
        check_config_context(args.context, config, name)
    except ContextError as exc:
        raise UsageError(f"--context: {exc}") from None


def _local_config(spec: str | None) -> tuple[str, JSONObject] | None:
    """(display name, config.json) of the folder `spec` names on this machine, reading nothing else."""
    try:
        folder = locate_model(spec or "")
        config = json.loads((folder / "config.json").read_text())
    except (EngineError, OSError, ValueError):
        return None
    return (display_name(folder), config) if isinstance(config, dict) else None


def load_model(engine: Engine, spec: str, context: int | None = None, mtp: MTPMode | None = None) -> ev.Loaded | None:
    """Load `spec` on the engine (in long-context mode when `context` is past its native length, which is said
    on stderr) and return its Loaded event; `mtp` (mtp_mode's, None: auto) off loads no MTP head. A model that
    cannot be found or read raises UsageError; any other failure is printed to stderr and gives None (the
    command exits 1)."""
    try:
        job = engine.load(spec, context=context) if mtp is None else engine.load(spec, context=context, mtp=mtp)
        info = job.result()
        assert isinstance(info, ev.Loaded)  # a load job ends with Loaded (result() raises a Failed)
        if info.yarn_factor:
            print(f"[{info.name}: {long_context.notice(info.yarn_factor)}]", file=sys.stderr)
        return info
    except EngineError as exc:
        if exc.code in LOAD_CODES:
            raise UsageError(exc.message) from exc
        print(f"qwen-desk: {exc.message}", file=sys.stderr)
        return None


def add_mtp_argument(parser: argparse.ArgumentParser) -> None:
    """--mtp: speculative decoding with the build's own MTP head."""
    parser.add_argument(
        "--mtp",
        choices=("auto", "on", "off"),
        default="auto",
        help="draft with the model's own MTP head and verify in one pass: auto (default: only while it pays), on, off",
    )


def mtp_mode(args: argparse.Namespace) -> MTPMode:
    """The engine's MTPMode for --mtp."""
    return MTPMode(getattr(args, "mtp", "auto") or "auto")


def mtp_notice(info: ev.Loaded, mode: str) -> str | None:
    """What to say on stderr about --mtp once the model is loaded (None: nothing): "on" for a build without a
    usable head says so and where the head comes from; decoding is then plain."""
    if mode != "on" or info.mtp_head_bytes:
        return None
    return (
        f"qwen-desk: --mtp on: {info.name} has no usable MTP head here (its conversion dropped the mtp.* tensors and "
        f"none was fetched beside it, or the head does not fit the model); fetch it with `qwen-desk download {info.name} "
        '--mtp` (the library says "MTP: X MB to fetch"). Replies are decoded without it.'
    )
