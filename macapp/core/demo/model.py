"""The demo model: a tiny random-weights Qwen3.5 made on this machine, so a newcomer sees the app work before
downloading gigabytes. It has the real architecture (the real engine, chat and server run it) and writes nonsense.

Made once into the app's data folder (about a second, no network) and reused; a half-written one is never used:
it is built in a temporary folder beside it and renamed into place.
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
COMPLETE_MARK = ".qwen-desk-demo"  # written last: a folder without it is rebuilt
NOTICE = (
    "This is the demo model: a tiny model with random weights, made on this machine in a second. It writes "
    "nonsense — it is only there to show the app working (streaming, thinking, the speed meter, history, the "
    "local server). For real answers, download a Qwen3.5 model from Models."
)
SHORT_NOTICE = "Demo model: random weights, writes nonsense — only to show the app working"


def demo_model_dir() -> Path:
    return paths.app_home() / FOLDER_NAME


def is_demo_model(path: str | Path | None) -> bool:
    return path is not None and Path(path).name == FOLDER_NAME and (Path(path) / COMPLETE_MARK).is_file()


def ensure_demo_model() -> Path:
    """The demo model's folder, made now if it is missing or incomplete. Runs MLX: call it on the engine's worker
    (`build_job`) from the window; the command line has no other MLX thread."""
    dest = demo_model_dir()
    if (dest / COMPLETE_MARK).is_file():
        return dest
    staging = Path(tempfile.mkdtemp(prefix=".demo-", dir=dest.parent))
    try:
        built = Path(make_tiny_model(staging / FOLDER_NAME, kind="moe", bits=4))
        (built / COMPLETE_MARK).write_text("made by Qwen Desk: random weights, writes nonsense\n")
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
