"""Screenshots of the real window for docs/: `python -m macapp.devtools.screenshots docs/` (or `make screenshots`).

Runs offscreen on a throwaway app home and HF cache, sized for a 'what if' Mac (M4 Pro, 24 GB) so the shots
do not depend on the machine that makes them. The chat, server and pictures shots run tiny random-weights test
models (their text is the model's script, not real prose; the server's requests come from the real `openai` and
`anthropic` clients on loopback); the download shot fetches from the local hub stand-in (tests/fixtures/hub.py),
so run it from a checkout with the test extras installed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from macapp.core.jsonvalue import JSONObject
from macapp.core.settings import Settings
from macapp.ui.pages import CHAT, LIBRARY, SERVER  # page numbers only: Qt, no hub settings read at import
from macapp.core.demo.tiny_model import make_tiny_model
from macapp.core.demo.tiny_vlm import make_tiny_vlm

if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication, QTableWidget, QWidget

WHAT_IF: JSONObject = {"chip": "M4 Pro", "memory_gb": 24}
SIZE = (1180, 760)
NO_END = {"logit_bias": {2: -100.0, 0: -100.0}}  # keeps the tiny model talking (its end tokens are 0 and 2)


def _no_broken_bytes(model: Path) -> dict[int, float]:
    """Bias against the tiny tokenizer's lone non-ASCII byte tokens: random weights string them into invalid
    UTF-8 that shows as replacement characters, which a real model does not write."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    return {i: -100.0 for i in range(tok.get_vocab_size()) if "\ufffd" in tok.decode([i])}


def _wait(app: QApplication, condition: Callable[[], object], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not reach the state to capture")
        app.processEvents()
        time.sleep(0.01)


def _pause(app: QApplication, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)


def _save(app: QApplication, window: QWidget, path: Path) -> None:
    from PySide6.QtCore import QEvent

    _pause(app, 0.2)
    # Apply pending layout requests first: a reply that grew in the last batch is laid out before a frame is drawn.
    for _ in range(3):
        app.sendPostedEvents(None, QEvent.Type.LayoutRequest)
    window.grab().save(str(path))
    print(f"wrote {path}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # (host, port) for an AF_INET socket
        return port


def _ask_both_apis(url: str, done: list[str]) -> threading.Thread:
    """Two requests to the local server, as other tools send them: one per API, off the GUI thread."""
    import anthropic
    import openai

    def run() -> None:
        no_thinking = {"chat_template_kwargs": {"enable_thinking": False}}
        oa = openai.OpenAI(base_url=f"{url}/v1", api_key="qwen-desk", max_retries=0, timeout=120)
        oa.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Name three colours."}], temperature=0, max_tokens=24, extra_body=no_thinking
        )
        done.append("openai")
        an = anthropic.Anthropic(base_url=url, api_key="qwen-desk", max_retries=0, timeout=120)
        an.messages.create(model="any", max_tokens=24, messages=[{"role": "user", "content": "And three shapes?"}], thinking={"type": "disabled"})
        done.append("anthropic")

    thread = threading.Thread(target=run, name="shots-clients", daemon=True)
    thread.start()
    return thread


def _cell_text(table: QTableWidget, row: int, column: int) -> str:
    item = table.item(row, column)
    if item is None:
        raise LookupError(f"no cell at row {row}, column {column}")
    return item.text()


def _landscape(path: Path, size: tuple[int, int], seed: int) -> Path:
    """A small made-up picture (sky, sun, hills) so the thumbnails look like photos, not test patterns."""
    from PIL import Image, ImageDraw

    w, h = size
    image = Image.new("RGB", size)
    draw = ImageDraw.Draw(image)
    top, bottom = ((70, 130, 200), (250, 200, 150)) if seed == 0 else ((30, 40, 90), (230, 120, 90))
    for y in range(h):
        t = y / h
        draw.line([(0, y), (w, y)], fill=tuple(int(a + (b - a) * t) for a, b in zip(top, bottom)))
    draw.ellipse([w * 0.62, h * 0.18, w * 0.82, h * 0.18 + w * 0.2], fill=(255, 230, 120))
    draw.polygon([(0, h), (0, h * 0.7), (w * 0.35, h * 0.5), (w * 0.7, h * 0.75), (w, h * 0.6), (w, h)], fill=(60, 120, 70))
    draw.polygon([(0, h), (w * 0.2, h * 0.8), (w * 0.55, h * 0.72), (w, h * 0.9), (w, h)], fill=(40, 90, 55))
    image.save(path)
    return path


def work_folder() -> Path:
    """A throwaway app home and HF cache for one run, removed when the process exits (the window holds it open till then)."""
    work = Path(tempfile.mkdtemp(prefix="qwen-desk-shots-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    return work


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "docs").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = work_folder()
    os.environ["QWEN_DESK_HOME"] = str(work / "home")
    os.environ["HF_HOME"] = str(work / "hf")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    os.environ["HF_HUB_OFFLINE"] = "0"

    from tests.fixtures.hub import HubStandIn, random_repo_files  # a developer's tool: `python -m` from the checkout

    hub = HubStandIn().start()
    os.environ["HF_ENDPOINT"] = hub.url

    # The window's modules only now, after the environment above: huggingface_hub reads HF_HOME and HF_ENDPOINT once, when first imported.
    from macapp.ui.app import make_application
    from macapp.ui.main_window import MainWindow
    from macapp.ui.messages import AssistantMessage
    from macapp.ui.style import apply_style

    app = make_application()
    settings = Settings()
    settings.update({"machine.what_if": WHAT_IF, "library.context": 32768, "chat.thinking": True})
    window = MainWindow(settings)
    window.resize(*SIZE)
    window.show()
    window.start_background_work(wait=True)
    lib = window.library

    # 1. The library as it opens: the best fit suggested and selected.
    window.show_page(LIBRARY)
    _save(app, window, out / "library.png")

    # 2. Details of a bigger model at a long context with an 8-bit KV cache.
    lib.set_context(131072)
    lib.kv_combo.setCurrentIndex(lib.kv_combo.findData(8))
    lib.select("mlx-community/Qwen3.5-35B-A3B-4bit")
    _save(app, window, out / "details.png")

    # 2b. A build too big at this context: the ways out, under the verdict, in view at the window's usual size.
    lib.kv_combo.setCurrentIndex(0)
    lib.select("mlx-community/Qwen3.5-27B-4bit")
    _save(app, window, out / "advice.png")

    # 3. A download in progress (the hub stand-in holds the transfer part-way so the shot can be taken).
    repo = "mlx-community/Qwen3.5-2B-4bit"
    hub.add_repo(repo, random_repo_files(shards=3, shard_bytes=48_000_000, seed=7))
    hub.stall("*.safetensors", after=30_000_000, seconds=20, times=3)
    lib.set_context(32768)
    lib.kv_combo.setCurrentIndex(0)
    lib.select(repo)
    lib.details.download_panel.download_button.click()
    panel = lib.details.download_panel
    _wait(app, lambda: "Downloading" in panel.headline.text() and panel.progress.value() > 400 and "/s" in panel.detail.text())
    _save(app, window, out / "download.png")
    if lib.downloads is None:  # started by the click above
        raise RuntimeError("the library has no download controller")
    lib.downloads.pause()
    _wait(app, lambda: panel.headline.text().startswith("Paused"), 10)

    # 4. Chat: one finished turn with its reasoning opened, and a second reply streaming with the live meter.
    model = make_tiny_model(work / "tiny-qwen3.5-moe", kind="moe")
    lib.open_local_folder(str(model))
    chat = window.chat
    lib.request_load()
    _wait(app, lambda: chat.controller.model_ref is not None)
    settings.set("chat.sampling.thinking", {"temperature": 0.0, "presence_penalty": 0.0, "max_tokens": 64})
    settings.set("chat.sampling.instant", {"temperature": 0.0, "presence_penalty": 0.0, "max_tokens": 2000})
    chat.composer.thinking.setChecked(True)
    chat.send("What is the answer to the question?")
    _wait(app, lambda: not chat.busy)
    first = chat.messages.widgets()[-1]
    if not isinstance(first, AssistantMessage) or first.reasoning is None:
        raise RuntimeError("the last message is not the reply, with its reasoning")
    first.reasoning.set_expanded(True)
    chat.composer.thinking.setChecked(False)
    chat.controller.sampling_overrides = {"logit_bias": {**NO_END["logit_bias"], **_no_broken_bytes(model)}}
    chat.send("Say it again, at length.")
    _wait(
        app,
        lambda: (
            chat.messages.current is not None
            and len(chat.messages.current.answer) > 45
            and "tok/s" in chat.meter.text()
            and (getattr(chat.messages.current.stats, "generation_tokens", 0) or 0) >= 20
        ),
    )
    chat.composer.input.setPlainText("")
    window.show_page(CHAT)
    _save(app, window, out / "chat.png")
    chat.stop()
    _wait(app, lambda: not chat.busy)

    # 5. The Local Server serving the tiny model, with a request from each API finished in its list.
    window.show_page(SERVER)
    server = window.server_panel
    server.port.setValue(_free_port())
    server.toggle.click()
    _wait(app, lambda: window.server.running and server.toggle.text() == "Stop")
    done: list[str] = []
    serving = window.server.server
    if serving is None:
        raise RuntimeError("the local server did not start")
    clients = _ask_both_apis(serving.base_url, done)
    _wait(app, lambda: not clients.is_alive() and server.table.rowCount() == 2 and all(_cell_text(server.table, r, 5) == "done" for r in range(2)), 120)
    if len(done) != 2:
        raise RuntimeError("a request to the local server failed")
    _save(app, window, out / "server.png")
    window.server.stop(wait=True)

    # 6. Pictures: a sent message with one, and another waiting in the composer (a tiny model with a vision tower).
    lib.open_local_folder(str(make_tiny_vlm(work / "tiny-qwen3.5-vl", kind="dense")))
    chat.controller.sampling_overrides = {}
    lib.request_load()
    _wait(app, lambda: chat.controller.model_ref is not None and chat.controller.model_ref.name == "tiny-qwen3.5-vl" and not chat.busy, 120)
    chat.new_chat()
    chat.composer.thinking.setChecked(False)
    chat.composer.attachments.add_files([_landscape(work / "hills.png", (320, 200), 0)])
    _wait(app, lambda: len(chat.composer.attachments.thumbs()) == 1)
    chat.send("What is in this picture?")
    _wait(app, lambda: not chat.busy, 120)
    chat.composer.attachments.add_files([_landscape(work / "dusk.png", (240, 240), 1)])
    _wait(app, lambda: len(chat.composer.attachments.thumbs()) == 1)
    chat.composer.input.setPlainText("And this one, taken an hour later?")
    window.show_page(CHAT)
    _save(app, window, out / "pictures.png")
    chat.composer.attachments.clear()
    chat.composer.input.setPlainText("")

    # 7. The library in dark appearance (the palette follows the system; forced here for the shot).
    os.environ["QWEN_DESK_APPEARANCE"] = "dark"
    apply_style(app)
    window.show_page(LIBRARY)
    lib.select("mlx-community/Qwen3.5-9B-8bit")
    _save(app, window, out / "library-dark.png")
    del os.environ["QWEN_DESK_APPEARANCE"]

    window.close()
    hub.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
