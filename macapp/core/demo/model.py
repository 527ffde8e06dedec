"""The demo model: a tiny random-weights Qwen3.5 made on this machine, so a newcomer sees the app work before
downloading gigabytes. It has the real architecture (the real engine, chat and server run it), and it cannot read
a message: whatever it is asked, it thinks `REASONING` and answers `ANSWER`, words that say what it is and what a
real model will do once downloaded (`tiny_model`'s script, firm under the model card's sampling).

Made once into the app's data folder (about a second, no network) and reused; a half-written one is never used:
it is built in a temporary folder beside it and renamed into place. One made by an earlier version of these words
is made again (`MARK_TEXT`).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from macapp.core import paths
from macapp.core.engine import Engine
from macapp.core.engine.jobs import Job
from macapp.core.events import TerminalEvent
from macapp.core.demo.tiny_model import make_tiny_model

FOLDER_NAME = "Tiny demo model"  # the folder's name is the model's name in the window and the history
COMPLETE_MARK = ".qwen-desk-demo"  # written last: a folder without it (or with other words in it) is made again
MARK_TEXT = "made by Qwen Desk: random weights, the fixed reply of 2026-12\n"

# Each piece is one token of the demo's tokenizer and no piece comes twice (tiny_model's script rules); pieces of a
# few words each, so the reply still streams.
REASONING = [
    "A real model",
    " thinks here",
    " before it answers",
    ": this part",
    " shows its reasoning",
    ". The demo model",
    " does not think",
    ".",
]
ANSWER = [
    "I am",
    " the demo model",
    ":",
    " a tiny model",
    " with random weights",
    ",",
    " made on this computer",
    " in a second",
    ". I cannot",
    " read your message",
    ", so",
    " every reply",
    " is this one",
    ", whatever you ask",
    ".\n\n",
    "Download",
    " a real",
    " Qwen3.5 model",
    " (Models,",
    " or `qwen-desk download`)",
    " and load it",
    ": it reads",
    " what you write",
    " and answers it",
    "!",
]
REPLY = "".join(ANSWER)
NOTICE = (
    "This is the demo model: a tiny model with random weights, made on this machine in a second. It cannot read "
    "what you write: every reply is the same few lines saying what it is. It is only there to show the app working "
    "(streaming, thinking, the speed meter, history, the local server). For real answers, download a Qwen3.5 model "
    "from Models (or `qwen-desk download`)."
)
SHORT_NOTICE = "Demo model: random weights, the same reply to anything — only to show the app working"


def demo_model_dir() -> Path:
    return paths.app_home() / FOLDER_NAME


def is_demo_model(path: str | Path | None) -> bool:
    return path is not None and Path(path).name == FOLDER_NAME and (Path(path) / COMPLETE_MARK).is_file()


def _mark(folder: Path) -> str | None:
    try:
        return (folder / COMPLETE_MARK).read_text()
    except OSError:
        return None


def ensure_demo_model() -> Path:
    """The demo model's folder, made now if it is missing, incomplete or of an earlier version. Runs MLX: call it
    on the engine's worker (`build_job`) from the window; the command line has no other MLX thread."""
    dest = demo_model_dir()
    if _mark(dest) == MARK_TEXT:
        return dest
    staging = Path(tempfile.mkdtemp(prefix=".demo-", dir=dest.parent))
    try:
        built = Path(make_tiny_model(staging / FOLDER_NAME, kind="moe", bits=4, reasoning=REASONING, answer=ANSWER, firm=True))
        (built / COMPLETE_MARK).write_text(MARK_TEXT)
        if dest.exists():
            shutil.rmtree(dest)  # an incomplete earlier try
        built.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


@dataclass
class DemoReady(TerminalEvent):
    path: str


def build_job(engine: Engine) -> Job:
    """Make (or find) the demo model on the engine's worker thread; the job ends with DemoReady or Failed."""

    def work(job: Job) -> None:
        job.emit(DemoReady(str(ensure_demo_model())))

    return engine.submit("demo-model", work)
