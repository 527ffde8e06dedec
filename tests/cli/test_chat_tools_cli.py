"""`qwen-desk chat` with MCP servers (real ones, written with the SDK) and the tiny scripted model that calls
`get_weather(city="Paris", days=3)` in every reply: --allow-tool, denial without a terminal, the interactive
question, the --json `tool_calls`, the 16-round bound, bad configs, and no server process left after a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from macapp.cli import main
from tests.fixtures.scripted import TOOL_CALL_ARGUMENTS

RESULT = "Sunny in Paris for 3 days (without the secret)."


def write_config(path, servers) -> str:
    path.write_text(json.dumps({"mcpServers": servers}))
    return str(path)


def run_json(capsys, *argv):
    code = main(["chat", *argv, "--json", "--no-think", "--temp", "0"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()], err


def test_allowed_tools_run_the_rest_are_denied(capsys, tmp_path, scripted_tool_model_path, mcp_files):
    config = write_config(tmp_path / "mcp.json", {"weather": mcp_files.stdio_json()})
    model = ["--model", str(scripted_tool_model_path), "--mcp-config", config, "--prompt", "Weather in Paris?"]
    (turn,), _ = run_json(capsys, *model, "--allow-tool", "weather/get_weather")
    calls = turn["tool_calls"]
    assert len(calls) == 16 and turn["finish_reason"] == "tool_rounds"  # the model never stops calling: the bound
    assert {(c["server"], c["name"], json.dumps(c["arguments"]), c["allowed"], c["result"]) for c in calls} == {
        ("weather", "get_weather", json.dumps(TOOL_CALL_ARGUMENTS), True, RESULT)
    }
    assert len(mcp_files.calls()) == 16 and "<tool_call>" not in turn["text"]
    (turn,), _ = run_json(capsys, *model)  # nothing allowed, nobody to ask: denied, and the tool never ran
    assert {(c["allowed"], c["result"]) for c in turn["tool_calls"]} == {(False, None)} and len(mcp_files.calls()) == 16
    (turn,), _ = run_json(capsys, *model, "--allow-tool", "other/*")
    assert not any(c["allowed"] for c in turn["tool_calls"])
    assert mcp_files.still_running() == []


def test_no_servers_no_tool_calls(capsys, tiny_moe_path):
    (turn,), _ = run_json(capsys, "--model", str(tiny_moe_path), "--prompt", "hi", "--no-history")
    assert turn["tool_calls"] == [] and turn["finish_reason"] == "stop"


def test_a_server_that_fails_to_start_is_a_warning_and_the_chat_goes_on(capsys, tmp_path, scripted_tool_model_path, mcp_files):
    config = write_config(tmp_path / "mcp.json", {"broken": mcp_files.stdio_json(mode="crash"), "missing": {"command": "no-such-mcp-server"}})
    (turn,), err = run_json(capsys, "--model", str(scripted_tool_model_path), "--mcp-config", config, "--prompt", "hi", "--no-history")
    assert 'MCP server "broken" is not available: it exited at start' in err
    assert "MCP server \"missing\" is not available: its command 'no-such-mcp-server' was not found" in err
    assert turn["tool_calls"] == [] and turn["finish_reason"] == "stop"  # no tools offered: the call is plain text


def test_bad_tool_flags_and_configs_exit_2_naming_the_problem(capsys, tmp_path, tiny_moe_path):
    bad = tmp_path / "mcp.json"
    bad.write_text('{"mcpServers": {"x": {"command": 3}}}')
    cases = [
        (["--mcp-config", str(bad)], f'{bad}: server "x": "command" must be a non-empty string'),
        (["--mcp-config", str(tmp_path / "nope.json")], "no such file"),
        (["--allow-tool", "weather"], "expected SERVER/TOOL or SERVER/*"),
        (["--mcp-timeout", "0"], "--mcp-timeout must be more than 0"),
    ]
    for argv, needle in cases:
        code = main(["chat", "--model", str(tiny_moe_path), "--prompt", "hi", *argv])
        out, err = capsys.readouterr()
        assert code == 2 and needle in err and out == "", argv
    bad.write_text("{oops")
    (tmp_path / "home").mkdir()
    os.environ["QWEN_DESK_HOME"] = str(tmp_path / "home")  # the default file, in the app's folder
    (tmp_path / "home" / "mcp.json").write_text("{oops")
    code = main(["chat", "--model", str(tiny_moe_path), "--prompt", "hi"])
    assert code == 2 and f"{tmp_path / 'home' / 'mcp.json'}: not valid JSON" in capsys.readouterr().err


def _cli(*argv, stdin=None, home):
    env = dict(os.environ, QWEN_DESK_HOME=str(home), MLX_DISABLE_COMPILE="1")
    return subprocess.run([sys.executable, "-m", "macapp", "chat", *argv], input=stdin, capture_output=True, text=True, timeout=300, env=env)


def test_interactive_chat_asks_with_the_arguments_and_leaves_no_server_behind(tmp_path, scripted_tool_model_path, mcp_files):
    write_config(tmp_path / "mcp.json", {"weather": mcp_files.stdio_json()})  # the app folder's own mcp.json
    proc = _cli("--model", str(scripted_tool_model_path), "--no-think", "--temp", "0", stdin="Weather?\na\n/quit\n", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("[tool call] weather / get_weather with arguments:") == 1  # "always": asked once
    assert '"city": "Paris"' in proc.stderr and '"days": 3' in proc.stderr
    assert proc.stderr.count("[tool weather/get_weather: done in") == 16 and len(mcp_files.calls()) == 16
    assert json.loads((tmp_path / "mcp_approvals.json").read_text()) == {"always": [{"server": "weather", "tool": "get_weather"}]}
    assert mcp_files.still_running() == []
