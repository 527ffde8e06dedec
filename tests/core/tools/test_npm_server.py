"""A published reference server from npm, run offline: @modelcontextprotocol/server-filesystem (Node).

It needs the package installed beforehand (`npm install @modelcontextprotocol/server-filesystem`); the test finds
its `mcp-server-filesystem` through $QWEN_DESK_MCP_FILESYSTEM or PATH and says how to get it when it is absent."""

from __future__ import annotations

import os
import shutil

import psutil
import pytest

from macapp.core.tools.config import ServerConfig
from macapp.core.tools.host import McpHost, ServerState

SERVER = os.environ.get("QWEN_DESK_MCP_FILESYSTEM") or shutil.which("mcp-server-filesystem")


def processes_naming(text: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and any(text in part for part in p.info["cmdline"] or []):
            found.append(p)
    return found


@pytest.mark.skipif(
    SERVER is None, reason="npm install @modelcontextprotocol/server-filesystem, then set $QWEN_DESK_MCP_FILESYSTEM to its mcp-server-filesystem"
)
def test_the_reference_filesystem_server_reads_a_file(tmp_path):
    root = tmp_path / "shared-folder"
    root.mkdir()
    (root / "note.txt").write_text("hello from a file\n")
    assert SERVER is not None
    with McpHost([ServerConfig("files", command=SERVER, args=(str(root),))]) as host:
        assert host.start() == []
        assert {"read_text_file", "list_directory", "write_file"} <= {t.offered for t in host.tools()}
        assert host.call(host.find("read_text_file"), {"path": str(root / "note.txt")}).text == "hello from a file\n"
        outside = host.call(host.find("read_text_file"), {"path": "/etc/hostname"})
        assert outside.is_error  # the server keeps to its folder
        assert processes_naming(str(root))
    assert host.servers()[0].state is ServerState.STOPPED
    gone, alive = psutil.wait_procs(processes_naming(str(root)), timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
