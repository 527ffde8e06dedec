"""The tool-loop tests' shared fixtures: a real stdio MCP server (tests/fixtures/mcp_server.py) that records its calls
and processes, and a history store."""

from __future__ import annotations

import pytest

from macapp.core.history import Store
from macapp.core.tools.host import McpHost
from tests.fixtures.mcp_servers import McpFiles


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> McpFiles:
    where = tmp_path_factory.mktemp("mcp")
    return McpFiles(where / "calls.txt", where / "pids.txt")


@pytest.fixture(scope="module")
def host(files):
    with McpHost([files.stdio()]) as h:
        yield h
    assert files.still_running() == []


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "history.sqlite3") as s:
        yield s
