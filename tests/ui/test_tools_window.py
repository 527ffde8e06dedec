"""MCP tools in the window: the tiny scripted model calls a real MCP server's tool (written with the SDK); the
approval dialog shows the server, the tool and the full arguments; Allow and Deny take their paths; each call is
a collapsible block in the reply, kept in the history; the Tools pane lists the server and revokes "always".

Screenshots of the dialog and of a finished call go to $QWEN_DESK_TOOL_SHOTS when set (docs/ holds the last ones)."""

from __future__ import annotations

import json
import os

import pytest
from PySide6.QtCore import Qt

from macapp.core.tools.approvals import Approvals, Decision, approvals_path
from tests.fixtures.scripted import TOOL_CALL_ARGUMENTS, TOOL_PREAMBLE
from tests.ui.helpers import GREEDY, history_settled

RESULT = "Sunny in Paris for 3 days (without the secret)."


@pytest.fixture
def tool_window(qtbot, settings, mcp_files, _isolated_home, scripted_tool_model_path):
    """The window with mcp.json in its app folder (one stdio server) and the scripted tool-calling model loaded."""
    from macapp.ui.app import make_application
    from macapp.ui.main_window import MainWindow

    (_isolated_home / "mcp.json").write_text(json.dumps({"mcpServers": {"weather": mcp_files.stdio_json()}}))
    settings.set("chat.sampling.thinking", GREEDY)
    settings.set("chat.sampling.instant", GREEDY)
    make_application()
    w = MainWindow(settings)
    qtbot.addWidget(w)
    w.resize(1000, 720)
    w.show()
    qtbot.waitExposed(w)
    w.start_background_work(wait=True)
    w.library.open_local_folder(str(scripted_tool_model_path))
    with qtbot.waitSignal(w.chat.controller.model_ready, timeout=60_000):
        assert w.library.request_load()
    w.chat.controller.tools.loop.max_rounds = 1  # the model calls in every reply: one round, then the clear stop
    yield w
    w.close()
    assert mcp_files.still_running() == []  # the window's shutdown stopped the server and its helper


def shots_dir(tmp_path):
    return os.environ.get("QWEN_DESK_TOOL_SHOTS") or str(tmp_path)


def ask(window, qtbot, text="Weather in Paris?"):
    chat = window.chat
    chat.composer.thinking.setChecked(False)
    chat.composer.input.setPlainText(text)
    with qtbot.waitSignal(chat.controller.tools.approval_shown, timeout=60_000) as shown:
        qtbot.keyClick(chat.composer.input, Qt.Key.Key_Return)
    return shown.args[0]


def test_allow_once_runs_the_tool_and_the_call_is_a_block_in_the_reply(tool_window, qtbot, mcp_files, tmp_path):
    dialog = ask(tool_window, qtbot)
    assert "get_weather" in dialog.title.text() and "weather" in dialog.title.text()
    assert json.loads(dialog.arguments.toPlainText()) == TOOL_CALL_ARGUMENTS  # the full arguments, as JSON
    assert '{\n  "city": "Paris",\n  "days": 3\n}' == dialog.arguments.toPlainText()
    assert mcp_files.calls() == []  # nothing runs before the answer
    dialog.grab().save(os.path.join(shots_dir(tmp_path), "tools-approval.png"))
    dialog.once_button.click()
    chat = tool_window.chat
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    history_settled(chat, qtbot)
    assert mcp_files.calls() == ["get_weather Paris 3"]
    reply = chat.messages.widgets()[-1]
    (block,) = reply.tool_calls
    assert block.header.text().startswith("Tool weather/get_weather · done in") and not block.expanded
    block.header.click()
    assert block.expanded and RESULT in block.body.toPlainText() and '"city": "Paris"' in block.body.toPlainText()
    assert "<tool_call>" not in reply.answer and "tool-call round limit" in reply.stats_label.text()
    assert_in_order(reply, block)
    saved = chat.controller.store.get_conversation(chat.controller.conversation_id).messages[-1]
    assert [(c["name"], c["allowed"], c["result"]) for c in saved.tool_calls] == [("get_weather", True, RESULT)]
    qtbot.waitUntil(lambda: reply.isVisible(), timeout=60_000)
    chat.grab().save(os.path.join(shots_dir(tmp_path), "tools-call.png"))
    # reopened from the history, the call is there again
    chat.new_chat()
    chat.open_conversation(chat.controller.conversation_id or saved.conversation_id)
    qtbot.waitUntil(lambda: bool(chat.messages.widgets()) and bool(chat.messages.widgets()[-1].tool_calls), timeout=60_000)
    reopened = chat.messages.widgets()[-1]
    assert_in_order(reopened, reopened.tool_calls[0])  # the saved call keeps its place in the text


def assert_in_order(reply, block):
    """The text the model wrote before its call, the call's block, then what came after (the round bound's note)."""
    before, after = reply.views
    lay = reply.layout()
    assert lay.indexOf(before) < lay.indexOf(block) < lay.indexOf(after)
    assert before.source_text == TOOL_PREAMBLE and after.source_text.startswith("[Stopped after 1 round of tool calls")


def test_deny_does_not_run_the_tool_and_always_is_remembered_and_revoked(tool_window, qtbot, mcp_files):
    chat = tool_window.chat
    dialog = ask(tool_window, qtbot)
    dialog.deny_button.click()
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    assert mcp_files.calls() == []
    (block,) = chat.messages.widgets()[-1].tool_calls
    assert block.header.text() == "Tool weather/get_weather · denied"
    history_settled(chat, qtbot)

    dialog = ask(tool_window, qtbot, "Again?")
    dialog.always_button.click()
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    assert mcp_files.calls() == ["get_weather Paris 3"]
    assert Approvals(approvals_path()).remembered() == [("weather", "get_weather")]
    pane = tool_window.show_tools()
    assert "run with your user's rights" in pane.findChildren(type(pane.where))[0].text()
    server = pane.servers.topLevelItem(0)
    assert (server.text(0), server.text(1)) == ("weather", "running")
    assert sorted(server.child(i).text(0) for i in range(server.childCount())) == ["get_time", "get_weather"]
    assert (pane.allowed.topLevelItem(0).text(0), pane.allowed.topLevelItem(0).text(1)) == ("weather", "get_weather")
    pane.allowed.itemWidget(pane.allowed.topLevelItem(0), 2).click()  # Revoke
    assert pane.allowed.topLevelItemCount() == 0 and Approvals(approvals_path()).remembered() == []
    pane.close()
    history_settled(chat, qtbot)
    dialog = ask(tool_window, qtbot, "Once more?")  # asked again
    dialog.deny_button.click()
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)


def test_a_turn_stopped_while_asking_closes_the_dialog_and_runs_nothing(tool_window, qtbot, mcp_files):
    chat = tool_window.chat
    dialog = ask(tool_window, qtbot)
    chat.stop()  # the dialog is modal: the turn is stopped by the app (closing, unloading), not by a key
    qtbot.waitUntil(lambda: not chat.busy, timeout=60_000)
    qtbot.waitUntil(lambda: chat.controller.tools.dialog is None, timeout=60_000)  # closed (answered "deny"), and deleted
    assert dialog.decision is Decision.DENY
    assert mcp_files.calls() == []
