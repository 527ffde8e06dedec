"""The `qwen-desk` command: subcommands on the core; no subcommand starts the window."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import TypeAlias

from macapp import __version__
from macapp.core.logs import setup_logging

# Each module defines `register(subparsers)`, which adds its parser and sets `func(args) -> int`.
SUBCOMMAND_MODULES = ("fit", "download", "chat", "history", "serve", "cache", "demo")
# What `register` is given (a string: argparse's class is generic only in typeshed, not at run time).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class UsageError(Exception):
    """Bad input from the user: printed as one clear line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qwen-desk",
        description="Run the Qwen3.5 family locally. With no command, opens the window.",
    )
    parser.add_argument("--version", action="version", version=f"qwen-desk {__version__}")
    parser.add_argument("--screenshot", metavar="PATH", help="render the main window to a PNG and exit")
    parser.add_argument("--self-test", action="store_true", help="check this installation end to end and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        module = importlib.import_module(f"macapp.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    try:
        if args.self_test:
            from macapp.cli.selftest import run_self_test  # why: it imports the engine and huggingface_hub; `import macapp.cli` stays light

            return run_self_test()
        if args.command is None:
            from macapp.ui.app import run_app  # why: PySide6 loads only for the window, never for a subcommand or --help

            return run_app(screenshot=args.screenshot)
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a pipe closed early fails here, not in the interpreter's exit
        return status
    except UsageError as exc:
        print(f"qwen-desk: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nqwen-desk: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `qwen-desk models | head -2`: the reader has what it wanted
        return quiet_after_closed_pipe()


def quiet_after_closed_pipe() -> int:
    """Point stdout at /dev/null so the interpreter's last flush does not fail again, and exit 0 like `ls | head`."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return 0
