"""A saved conversation reopened after a restart (run by hand): what its first new message reads, and its first-token
time, three ways side by side in one run.

    .venv/bin/python bench/reopen_bench.py [--turns 3] [--reply 300] [--model PATH]

A conversation of --turns exchanges with thinking on (each reply --reply tokens of the model's own text, <|im_end|>
banned so that they run long) is recorded into a history (real SQLite) by a session keeping positions on a disk
store, as the window and `qwen-desk chat` do; then the process is "restarted" (a new Engine, a copy of the disk
folder as the session left it) and the conversation, reopened from the history, is sent one more message:
- saved tokens: the history's replies in the tokens their session held (turns.replay): the position left after the
  last reply matches whole;
- text only: the same history with the saved tokens removed (as a history from before they were kept): each reply
  is read again as its text, so the prompt parts from the session's cache at the first reply;
- no disk store: read whole.
Each row is that message's prompt tokens read (GenerationStats.prompt_tokens) and its time to first token.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from macapp.core.events import Reply

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TIMEOUT = 3600


def user_message(turn: int) -> str:
    return f"Question {turn}: " + " ".join(f"point {turn}.{i} on rivers and lakes;" for i in range(10))


def measure(model: Path, turns: int, reply: int, work: Path) -> tuple[int, dict[str, "Reply"]]:
    from macapp.core.engine import Engine
    from macapp.core.events import TurnKind
    from macapp.core.history import Store
    from macapp.core.prompt_disk import DiskStore
    from macapp.core.prompt_disk.shelf import shelves
    from macapp.core.recorder import ChatRecorder
    from macapp.core.sampling import greedy

    def engine(folder: Path | None) -> tuple[Engine, DiskStore | None]:
        e = Engine()
        disk = DiskStore(folder, 10**10, 0) if folder is not None else None
        if disk is not None:
            e.position_shelf = shelves(disk)
        e.load(str(model)).result(timeout=TIMEOUT)
        return e, disk

    live, disk = engine(work / "prompts")
    vocab = live.model.tokenizer.get_vocab()
    long_text = greedy(reply, logit_bias={vocab["<|im_end|>"]: -1e9, vocab["<|endoftext|>"]: -1e9})
    history = Store.open(work / "history.sqlite3")
    recorder = ChatRecorder(history, model=model.name, system_prompt="You are a careful assistant.")
    session = live.new_session(system_prompt="You are a careful assistant.")
    for t in range(1, turns + 1):
        turn = recorder.begin(TurnKind.SEND, user_message(t), thinking=True)
        for event in session.send(user_message(t), thinking=True, sampling=long_text).events(timeout=TIMEOUT):
            turn.feed(event)
    assert disk is not None
    disk.flush()
    context, rows = len(session.tokens), {}
    live.close()
    disk.close()
    saved = history.get_conversation(recorder.conversation_id)
    with_tokens = saved.chat_messages(include_system=False)
    text_only = [{k: v for k, v in m.items() if k != "cache_tokens"} for m in with_tokens]
    history.close()
    for name, messages, keep_disk in (("saved tokens", with_tokens, True), ("text only", text_only, True), ("no disk store", with_tokens, False)):
        folder = None
        if keep_disk:
            folder = work / f"prompts-{len(rows)}"
            shutil.copytree(work / "prompts", folder)
        e, store = engine(folder)
        try:
            reopened = e.new_session(system_prompt=saved.system_prompt, messages=messages)
            rows[name] = reopened.send("And one more question?", thinking=True, sampling=greedy(8)).result(timeout=TIMEOUT)
        finally:
            e.close()
            if store is not None:
                store.close()
    return context, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--reply", type=int, default=300, help="tokens of each recorded reply")
    parser.add_argument("--model", type=Path, help="a model folder (default: the tiny MoE, built in a temporary folder)")
    args = parser.parse_args()
    import mlx.core as mx

    work = Path(tempfile.mkdtemp(prefix="reopen-"))
    try:
        model = args.model
        if model is None:
            from macapp.core.demo.tiny_model import make_tiny_model

            model = make_tiny_model(work / "tiny-qwen3.5-moe", "moe")
        context, got = measure(model, args.turns, args.reply, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"## A saved conversation reopened after a restart (bench/reopen_bench.py) — {stamp}, {platform.machine()} {platform.system()}")
    print(f"\n{model.name}, MLX {mx.__version__}, {mx.default_device()}: {args.turns} exchanges with thinking on, replies of {args.reply} tokens,")
    print(f"{context:,} tokens in the session's cache; the reopened conversation's next message:\n")
    print("| reopened from the history | prompt tokens read | first token |")
    print("|---|---|---|")
    for name in ("saved tokens", "text only", "no disk store"):
        stats = got[name].stats
        print(f"| {name} | {stats.prompt_tokens:,} | {stats.ttft_s:.2f} s |")
    same = got["saved tokens"].token_ids == got["no disk store"].token_ids
    print(f"\nThe same reply from the disk's position as from a whole read: {same}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
