"""`qwen-desk history`: list, show, search, export, import, rename and delete saved conversations."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

from macapp.cli import Subparsers, UsageError
from macapp.core.history import (
    ImportFormatError,
    NotFoundError,
    ReadOnlyStoreError,
    Store,
    StoreError,
    iso_time,
)
from macapp.core.vision.pictures import FILES


def _conversation_id(text: str) -> int:
    try:
        value = int(text.lstrip("#"))
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a conversation id (see `qwen-desk history list`)")
    return value


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "history",
        help="list, show, search, export and import saved conversations",
        description="Saved conversations (the same ones the window shows). Without an action, lists them.",
    )
    parser.set_defaults(func=run, json=False, limit=None)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    p = actions.add_parser("list", help="conversations, newest first")
    p.add_argument("--json", action="store_true", help="print a JSON array of {id, title, model, created, updated, messages}")
    p.add_argument("--limit", type=int, metavar="N", help="at most N conversations")

    p = actions.add_parser("show", help="print one conversation")
    p.add_argument("id", type=_conversation_id, metavar="ID")
    p.add_argument("--no-reasoning", action="store_true", help="leave out the model's reasoning")

    p = actions.add_parser("export", help="write one conversation as Markdown or JSON")
    p.add_argument("id", type=_conversation_id, metavar="ID")
    p.add_argument("--format", choices=("md", "json"), help="md (default, or from the --output suffix) or json")
    p.add_argument("--no-reasoning", action="store_true", help="leave out the model's reasoning")
    p.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output")

    p = actions.add_parser("import", help="add a conversation from an exported JSON file")
    p.add_argument("file", metavar="FILE", help="a file written by `history export --format json` (- for stdin)")

    p = actions.add_parser("search", help="find messages containing every word of TEXT")
    p.add_argument("text", nargs="+", metavar="TEXT", help='words to find; "quote" a phrase')
    p.add_argument("--json", action="store_true", help="print a JSON array of hits")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="at most N hits (default 50)")

    p = actions.add_parser("rename", help="give a conversation a new title")
    p.add_argument("id", type=_conversation_id, metavar="ID")
    p.add_argument("title", nargs="+", metavar="TITLE")

    p = actions.add_parser("delete", help="delete a conversation for good")
    p.add_argument("id", type=_conversation_id, metavar="ID")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation at a terminal")


def run(args: argparse.Namespace) -> int:
    try:
        store = Store.open(pictures=FILES)
    except StoreError as exc:
        print(f"qwen-desk: {exc}", file=sys.stderr)
        return 1
    with store:
        if store.notice:
            print(f"qwen-desk: note: {store.notice}", file=sys.stderr)
        try:
            return _ACTIONS[args.action or "list"](store, args)
        except NotFoundError as exc:
            raise UsageError(f"{exc} See `qwen-desk history list` for the ids.") from exc
        except ReadOnlyStoreError as exc:
            print(f"qwen-desk: nothing changed: {exc}", file=sys.stderr)
            return 1
        except StoreError as exc:
            print(f"qwen-desk: {exc}", file=sys.stderr)
            return 1


def _local(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _print_json(value: object) -> None:
    print(json.dumps(value, ensure_ascii=False, indent=2))


def _list(store: Store, args: argparse.Namespace) -> int:
    conversations = store.list_conversations(limit=args.limit)
    if args.json:
        _print_json(
            [
                {
                    "id": c.id,
                    "title": c.display_title,
                    "model": c.model,
                    "created": iso_time(c.created),
                    "updated": iso_time(c.updated),
                    "messages": c.message_count,
                }
                for c in conversations
            ]
        )
        return 0
    if not conversations:
        print(f"No saved conversations yet ({store.path}).")
        return 0
    width = max(2, *(len(str(c.id)) for c in conversations))
    model_width = min(28, max(5, *(len(c.model) for c in conversations)))
    print(f"{'ID':>{width}}  {'UPDATED':16}  {'MSGS':>4}  {'MODEL':{model_width}}  TITLE")
    for c in conversations:
        model = c.model if len(c.model) <= model_width else c.model[: model_width - 1] + "…"
        print(f"{c.id:>{width}}  {_local(c.updated):16}  {c.message_count:>4}  {model:{model_width}}  {c.display_title}")
    return 0


def _show(store: Store, args: argparse.Namespace) -> int:
    sys.stdout.write(store.export_markdown(args.id, include_reasoning=not args.no_reasoning))
    return 0


def _export(store: Store, args: argparse.Namespace) -> int:
    fmt = args.format
    if fmt is None:
        fmt = "json" if args.output and args.output.lower().endswith(".json") else "md"
    include = not args.no_reasoning
    text = store.export_json(args.id, include) if fmt == "json" else store.export_markdown(args.id, include)
    if not args.output or args.output == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.output).expanduser()
    if out.is_dir():
        raise UsageError(f"{out} is a folder; give a file name for --output.")
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"Could not write {out}: {exc.strerror or exc}.") from exc
    print(f"Exported conversation {args.id} to {out}", file=sys.stderr)
    return 0


def _import(store: Store, args: argparse.Namespace) -> int:
    try:
        data = sys.stdin.read() if args.file == "-" else Path(args.file).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"Could not read {args.file}: {getattr(exc, 'strerror', None) or exc}.") from exc
    try:
        new_id = store.import_json(data)
    except ImportFormatError as exc:
        raise UsageError(f"{args.file} is not an exported conversation: {exc}") from exc
    print(f"Imported as conversation {new_id}: {store.get_conversation(new_id).display_title}")
    return 0


def _search(store: Store, args: argparse.Namespace) -> int:
    query = " ".join(args.text)
    hits = store.search(query, limit=args.limit)
    if args.json:
        _print_json(
            [
                {
                    "conversation_id": h.conversation_id,
                    "title": h.conversation_title or "New chat",
                    "message_id": h.message_id,
                    "position": h.position,
                    "role": h.role,
                    "snippet": h.snippet,
                    "updated": iso_time(h.updated),
                }
                for h in hits
            ]
        )
        return 0
    if not hits:
        print(f"No messages contain {query!r}.")
        return 0
    last = None
    for h in hits:
        if h.conversation_id != last:
            print(f"{h.conversation_id}  {h.conversation_title or 'New chat'}")
            last = h.conversation_id
        print(f"    {h.role:9}  {h.snippet}")
    return 0


def _rename(store: Store, args: argparse.Namespace) -> int:
    title = " ".join(" ".join(args.title).split())
    if not title:
        raise UsageError("The new title is empty.")
    store.rename(args.id, title)
    print(f"Renamed conversation {args.id}: {title}")
    return 0


def _delete(store: Store, args: argparse.Namespace) -> int:
    conv = store.get_conversation(args.id)
    label = f"conversation {conv.id} “{conv.display_title}” ({conv.message_count} messages)"
    if not args.yes and sys.stdin.isatty():
        answer = input(f"Delete {label}? This cannot be undone from here. [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing deleted.")
            return 1
    store.delete(conv.id)
    print(f"Deleted {label}.")
    return 0


_ACTIONS = {
    "list": _list,
    "show": _show,
    "export": _export,
    "import": _import,
    "search": _search,
    "rename": _rename,
    "delete": _delete,
}
