"""`qwen-desk cache`: the prompt checkpoints kept on disk (macapp.core.prompt_disk), shown or cleared.

qwen-desk cache            # where they are, how much each model keeps, the default size
qwen-desk cache --json     # the same as one JSON object
qwen-desk cache --clear    # remove them all (every model's); the next session reads its prompt afresh
"""

from __future__ import annotations

import argparse
import json

from typing import TYPE_CHECKING

from macapp.cli import Subparsers, UsageError
from macapp.core.prompt_disk import DiskStore, SizeError, default_bytes, describe, parse_size, prompts_dir
from macapp.core.prompt_disk.shelf import shelves

if TYPE_CHECKING:
    from macapp.core.engine import Engine


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "cache",
        help="show or clear the prompt checkpoints kept on disk",
        description="The prompt checkpoints `qwen-desk serve`, `qwen-desk chat` and the window keep on disk, so a new "
        "agent session or a reopened conversation reads only what is new. Without an option, shows them.",
    )
    parser.add_argument("--clear", action="store_true", help="remove every checkpoint (of every model)")
    parser.add_argument("--json", action="store_true", help="print {folder, bytes, files, default_limit_bytes, models: [...]}")
    parser.set_defaults(func=run)


def add_disk_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """--prompt-cache-disk SIZE, for `serve` and `chat` (`what`: what a warm start spares there)."""
    parser.add_argument(
        "--prompt-cache-disk",
        metavar="SIZE",
        help=f"keep prompt checkpoints on disk too, at most SIZE (20GB, 512MB; 0 turns it off), so {what} reads only "
        "what is new (default: the smaller of 20 GB and a tenth of the free disk; not with --hostfile). "
        "`qwen-desk cache` shows and clears them",
    )


def disk_bytes(args: argparse.Namespace) -> int | None:
    """--prompt-cache-disk in bytes (None: the default size); UsageError for a size that cannot be read."""
    if args.prompt_cache_disk is None:
        return None
    try:
        return parse_size(args.prompt_cache_disk)
    except SizeError as exc:
        raise UsageError(f"--prompt-cache-disk: {exc}") from None


def open_store(args: argparse.Namespace, engine: "Engine") -> DiskStore:
    """The app's disk store at --prompt-cache-disk's size, given to `engine`'s chat sessions (not on several Macs,
    whose engine cannot batch: their caches live on every rank)."""
    store = DiskStore.open(disk_bytes(args))
    if engine.batches and store.max_bytes:
        engine.position_shelf = shelves(store)
    return store


def run(args: argparse.Namespace) -> int:
    folder = prompts_dir()
    store = DiskStore(folder, 0)  # reads and removes files; keeps no index and writes nothing
    if args.clear:
        freed = store.clear()
        print(f"Removed the prompt checkpoints in {folder} ({describe(freed)}).")
        return 0
    models = store.summary()
    total = sum(m.nbytes for m in models)
    if args.json:
        out = {
            "folder": str(folder),
            "bytes": total,
            "files": sum(m.files for m in models),
            "default_limit_bytes": default_bytes(folder),
            "models": [{"model": m.model, "fingerprint": m.fingerprint, "files": m.files, "bytes": m.nbytes} for m in models],
        }
        print(json.dumps(out, indent=2))
        return 0
    print(f"Prompt checkpoints in {folder}: {describe(total)} in {sum(m.files for m in models)} files")
    for m in models:
        print(f"  {m.model or '(unknown model)'} [{m.fingerprint[:12]}]: {m.files} files, {describe(m.nbytes)}")
    print(f"Default size: {describe(default_bytes(folder))} (the smaller of 20 GB and a tenth of the free disk); set it with --prompt-cache-disk SIZE")
    print("Clear them with: qwen-desk cache --clear")
    return 0
