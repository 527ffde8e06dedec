"""`qwen-desk cache`: the prompt checkpoints kept on disk (macapp.core.prompt_disk), shown or cleared.

qwen-desk cache            # where they are, how much each model keeps, the default size
qwen-desk cache --json     # the same as one JSON object
qwen-desk cache --clear    # remove them all (every model's); the next session reads its prompt afresh
"""

from __future__ import annotations

import argparse
import json

from macapp.cli import Subparsers


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


def run(args: argparse.Namespace) -> int:
    from macapp.core.prompt_disk import DiskStore, default_bytes, describe, prompts_dir

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
