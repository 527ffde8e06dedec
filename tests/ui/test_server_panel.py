"""The Local Server page on the real window: start/stop on the chat's loaded model, the base URL, the settings
copied for other tools, the live request list, the chat told while the server answers; nothing in the history."""

from __future__ import annotations

import json
import socket
import threading

import httpx2
import openai
import pytest
from PySide6.QtGui import QGuiApplication

from macapp.core.demo.tiny_model import SCRIPT_ANSWER
from macapp.server.activity import RequestRecord, RequestState
from macapp.ui.main_window import SERVER
from macapp.ui.server_panel import SPEED_COLUMN
from tests.ui.helpers import worker_held

ANSWER = "".join(SCRIPT_ANSWER)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def panel(chat, window, qtbot):
    window.show_page(SERVER)
    panel = window.server_panel
    panel.port.setValue(free_port())
    with qtbot.waitSignal(window.server.started, timeout=60_000):
        panel.toggle.click()
    yield panel
    window.server.stop(wait=True)


def ask(url: str, results: list) -> threading.Thread:
    def run() -> None:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
        reply = client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "hi"}], temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
        )
        results.append(reply.choices[0].message.content)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_start_copy_serve_and_stop(panel, window, chat, qtbot):
    url = window.server.server.base_url
    assert url.startswith("http://127.0.0.1:") and url in panel.url.text()
    assert panel.toggle.text() == "Stop" and not panel.port.isEnabled()

    assert panel.copy.isEnabled()
    panel.copy.click()  # the button, as the user presses it
    text = QGuiApplication.clipboard().text()
    assert text == window.server.settings_text() and "Copied" in panel.message.text()
    assert f"OPENAI_BASE_URL={url}/v1" in text
    env = json.loads(text[text.index("{") :])["env"]
    assert env["ANTHROPIC_BASE_URL"] == url and env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert env["ANTHROPIC_MODEL"] == window.server.model_name and env["ANTHROPIC_AUTH_TOKEN"]

    conversations_before = len(chat.controller.store.list_conversations())
    results: list = []
    thread = ask(url, results)
    qtbot.waitUntil(lambda: not thread.is_alive(), timeout=60_000)
    assert results == [ANSWER]
    qtbot.waitUntil(lambda: panel.table.rowCount() == 1 and panel.table.item(0, 5).text() == "done", timeout=60_000)
    assert "openai" in panel.table.item(0, 0).text()
    assert int(panel.table.item(0, 1).text()) > 0 and int(panel.table.item(0, 3).text()) > 0
    thread = ask(url, results)  # the same prompt again: reused from the first one's checkpoints, shown in the list
    qtbot.waitUntil(lambda: not thread.is_alive(), timeout=60_000)
    qtbot.waitUntil(lambda: panel.table.rowCount() == 2 and panel.table.item(1, 5).text() == "done", timeout=60_000)
    assert int(panel.table.item(1, 2).text()) > 0 and panel.table.item(0, 2).text() == "0"
    assert len(chat.controller.store.list_conversations()) == conversations_before  # not written to the chat history

    with qtbot.waitSignal(window.server.stopped, timeout=60_000):
        panel.toggle.click()  # stop (off the GUI thread)
    assert panel.toggle.text() == "Start" and panel.url.text() == "Not running" and panel.message.text() == "Stopped."
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"{url}/health", timeout=5)


def test_a_request_waits_for_the_engine_and_the_chat_is_told(panel, window, chat, qtbot):
    url = window.server.server.base_url
    results: list = []
    with worker_held(chat.controller.engine):  # the engine is busy with other work (as with a chat reply)
        thread = ask(url, results)
        qtbot.waitUntil(lambda: panel.table.rowCount() == 1, timeout=60_000)
        assert panel.table.item(0, 5).text() == "waiting for the engine"
        qtbot.waitUntil(lambda: "local server is answering" in window.status.currentMessage(), timeout=60_000)
        assert chat.send("And a chat message meanwhile")  # queued behind the server's request: said, not frozen
        assert "Waiting for the local server" in chat.meter.text()
    qtbot.waitUntil(lambda: not thread.is_alive(), timeout=60_000)
    assert results == [ANSWER]
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    assert chat.messages.widgets()[-1].answer == ANSWER
    qtbot.waitUntil(lambda: "local server" not in window.status.currentMessage(), timeout=60_000)


def test_start_without_a_model_says_why(window, qtbot):
    window.show_page(SERVER)
    with qtbot.waitSignal(window.server.failed, timeout=60_000):
        window.server_panel.toggle.click()
    assert "Load a model first" in window.server_panel.message.text()
    assert window.server_panel.toggle.text() == "Start" and not window.server.running


def test_a_reply_the_mtp_head_drafted_for_says_so_on_its_speed(window):
    panel = window.server_panel
    panel.show_record(RequestRecord(1, "127.0.0.1:5000 openai", "openai", 0.0, RequestState.DONE, 10, 0, 5, 50.0, mtp_tokens_per_step=2.5, mtp_acceptance=0.75))
    panel.show_record(RequestRecord(2, "127.0.0.1:5001 openai", "openai", 0.0, RequestState.DONE, 10, 0, 5, 40.0))
    drafted, plain = panel.table.item(0, SPEED_COLUMN), panel.table.item(1, SPEED_COLUMN)
    assert drafted.text() == "50.0" and drafted.toolTip() == "MTP: 2.50 tokens per verify pass, 75% of drafts kept"
    assert plain.text() == "40.0" and plain.toolTip() == ""
