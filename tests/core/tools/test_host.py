"""The MCP host with real servers written with the SDK: stdio (through guard.py) and streamable HTTP on loopback;
a failing start, a missing command, a malformed config, a timeout, a huge result, name clashes, secrets, and no
server process outliving the host, closed or killed."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap

import pytest

from macapp.core.tools.config import ConfigError, ServerConfig, read_config
from macapp.core.tools.host import McpHost, ServerState
from macapp.core.tools.results import RESULT_LIMIT, for_prompt

SECRET = "s3cr3t-token-value"


def test_stdio_server_runs_its_tool_and_stops_with_its_helpers(mcp_files):
    with McpHost([mcp_files.stdio(MCP_SECRET=SECRET)]) as host:
        assert host.start() == []
        assert {t.offered for t in host.tools()} == {"get_weather", "get_time"}
        outcome = host.call(host.find("get_weather"), {"city": "Oslo", "days": 2})
        assert not outcome.is_error and outcome.text == "Sunny in Oslo for 2 days (with the secret)."
        assert mcp_files.calls() == ["get_weather Oslo 2"]
        assert [s.state for s in host.servers()] == [ServerState.RUNNING]
        assert len(mcp_files.pid_list()) == 2  # the server and its helper process
    assert mcp_files.still_running() == []
    assert [s.state for s in host.servers()] == [ServerState.STOPPED]


def test_http_server_on_loopback(mcp_files, http_server):
    with McpHost([ServerConfig("web", url=http_server)]) as host:
        assert host.start() == []
        outcome = host.call(host.find("get_time"), {"city": "Rome"})
        assert outcome.text == "It is noon in Rome."


def test_servers_that_fail_to_start_are_warnings_and_the_others_work(mcp_files):
    servers = [mcp_files.stdio("crashy", mode="crash"), ServerConfig("ghost", command="no-such-mcp-command"), mcp_files.stdio("good")]
    with McpHost(servers) as host:
        warnings = host.start()
        assert len(warnings) == 2
        assert 'MCP server "crashy"' in warnings[0] and "exited at start" in warnings[0]
        assert 'MCP server "ghost"' in warnings[1] and "'no-such-mcp-command' was not found" in warnings[1]
        states = {s.config.name: s.state for s in host.servers()}
        assert states == {"crashy": ServerState.FAILED, "ghost": ServerState.FAILED, "good": ServerState.RUNNING}
        assert {t.server for t in host.tools()} == {"good"}


def test_a_name_two_servers_share_gets_the_server_prefix(mcp_files, http_server):
    with McpHost([mcp_files.stdio("local"), ServerConfig("web server", url=http_server)]) as host:
        host.start()
        offered = {t.offered: (t.server, t.name) for t in host.tools()}
        assert offered == {
            "local__get_weather": ("local", "get_weather"),
            "local__get_time": ("local", "get_time"),
            "web_server__get_weather": ("web server", "get_weather"),
            "web_server__get_time": ("web server", "get_time"),
        }
        assert host.call(host.find("web_server__get_time"), {"city": "Oslo"}).text == "It is noon in Oslo."


def test_a_hanging_tool_times_out_and_the_host_goes_on(mcp_files):
    with McpHost([mcp_files.stdio(mode="slow")], timeout_s=1.0) as host:
        host.start()
        outcome = host.call(host.find("get_weather"), {"city": "Oslo"})
        assert outcome.timed_out and outcome.is_error and "did not answer within 1 s" in outcome.text
        assert host.call(host.find("get_time"), {"city": "Oslo"}).text == "It is noon in Oslo."
    assert mcp_files.still_running() == []


def test_a_huge_result_is_cut_with_a_note(mcp_files):
    with McpHost([mcp_files.stdio(mode="huge")]) as host:
        host.start()
        outcome = host.call(host.find("get_weather"), {"city": "Oslo"})
    assert len(outcome.text) == 3 * 1024 * 1024
    text = for_prompt(outcome.text)
    assert len(text.encode()) <= RESULT_LIMIT
    assert text.startswith("xxxx") and text.endswith("the tool's full result is too large for the prompt]")
    assert "result cut: 3145728 bytes" in text


def test_malformed_configs_name_the_file_and_the_problem(tmp_path):
    path = tmp_path / "mcp.json"
    cases = {
        "{not json": "not valid JSON",
        '{"mcpServers": []}': "expected an object",
        '{"mcpServers": {"a": {"args": ["x"]}}}': 'server "a": give either "command"',
        '{"mcpServers": {"a": {"command": "x", "args": "y"}}}': 'server "a": "args" must be a list of strings',
        '{"mcpServers": {"a": {"url": "ftp://x"}}}': 'server "a": "url" must be an http',
        '{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}': '"env" must be an object of string values',
    }
    for text, problem in cases.items():
        path.write_text(text)
        with pytest.raises(ConfigError) as caught:
            read_config(path)
        assert str(path) in str(caught.value) and problem in str(caught.value), text
    assert read_config(tmp_path / "absent.json") == []
    path.write_text(
        json.dumps({"mcpServers": {"files": {"command": "npx", "args": ["-y", "server"], "env": {"K": "v"}}, "web": {"url": "http://127.0.0.1:1/mcp"}}})
    )
    files, web = read_config(path)
    assert (files.command, files.args, files.env, web.url, web.transport) == ("npx", ("-y", "server"), {"K": "v"}, "http://127.0.0.1:1/mcp", "http")


def test_secrets_from_env_never_reach_the_log(mcp_files, caplog):
    caplog.set_level(logging.DEBUG)
    config = mcp_files.stdio("crashy", mode="crash", MCP_SECRET=SECRET)
    assert SECRET not in repr(config) and SECRET not in config.describe()
    with McpHost([config, ServerConfig("ghost", command="nope", env={"TOKEN": SECRET})]) as host:
        host.start()
    assert caplog.records and SECRET not in caplog.text


KILLED_APP = textwrap.dedent(
    """
    import sys
    from macapp.core.tools.config import ServerConfig
    from macapp.core.tools.host import McpHost
    host = McpHost([ServerConfig("w", command=sys.executable, args=(sys.argv[1], "stdio"), env={"MCP_PIDS": sys.argv[2]})])
    assert host.start() == []
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def test_a_killed_app_leaves_no_server_process(mcp_files):
    from tests.fixtures.mcp_servers import SERVER_SCRIPT

    app = subprocess.Popen(
        [sys.executable, "-c", KILLED_APP, str(SERVER_SCRIPT), str(mcp_files.pids)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert app.stdout is not None and app.stdout.readline() == "ready\n"
    assert len(mcp_files.pid_list()) == 2
    app.send_signal(signal.SIGKILL)
    app.wait(10)
    assert mcp_files.still_running() == []
