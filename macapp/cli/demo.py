"""`qwen-desk demo`: try the app without a download — a tiny model made on this machine, then the terminal chat.

    qwen-desk demo                   # make the demo model (once, ~1 s), then chat with it
    qwen-desk demo --prompt hi       # one scripted turn (the `chat` flags work too: --json, --no-think…)
    qwen-desk demo --path            # only print its folder: qwen-desk serve --model "$(qwen-desk demo --path)"

It cannot read a message (random weights): every reply says what it is and what a real model will do. It is there
to show streaming, thinking, the meter and the history.
"""

from __future__ import annotations

import argparse
import sys

from macapp.cli import Subparsers, chat
from macapp.core.demo.model import NOTICE, ensure_demo_model

DEMO_MAX_TOKENS = 200  # random weights may never write an end token: keep each reply short


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="try it without a download: a tiny demo model (the same reply to anything) and the chat",
        description="Make a tiny random-weights model on this machine and chat with it. It gives the same reply to anything: it is "
        "only there to show the app working before you download a real model. Takes `qwen-desk chat`'s flags.",
    )
    parser.add_argument("--path", action="store_true", help="only make the demo model and print its folder")
    chat = subparsers.choices["chat"]  # registered before this one (SUBCOMMAND_MODULES' order)
    for action in chat._actions:  # the same flags as chat, but no --model: the demo is the model
        if action.dest not in ("help", "model"):
            parser._add_action(action)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = ensure_demo_model()
    if args.path:
        print(path)
        return 0
    if args.max_tokens is None:
        args.max_tokens = DEMO_MAX_TOKENS
    if not args.json:
        print(f"[{NOTICE}]", file=sys.stderr)
    args.model = str(path)
    return int(chat.run(args) or 0)
