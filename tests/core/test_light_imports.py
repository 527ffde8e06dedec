"""What a module loads when it is imported: the fit's arithmetic loads no downloader and no huggingface_hub, and the
download package hands on its names without importing its modules until one is used; the chat command and the window
load the MCP SDK only when a tool server starts."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import macapp.core.download as download_package


def _loaded_after(statement: str) -> list[str]:
    """The modules a fresh interpreter holds after `statement` (run alone, so nothing else was imported before)."""
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return list(json.loads(result.stdout.splitlines()[-1]))


def test_the_fit_arithmetic_loads_no_downloader_and_no_hub_client():
    loaded = _loaded_after("import macapp.core.fit.estimate")
    assert "macapp.core.fit.estimate" in loaded and "macapp.core.catalog" in loaded  # the check ran
    assert [m for m in loaded if m == "huggingface_hub" or m.startswith("huggingface_hub.")] == []
    assert [m for m in loaded if m == "macapp.core.download" or m.startswith("macapp.core.download.")] == []
    assert "httpx2" not in loaded


def test_the_chat_command_and_the_tools_window_load_no_mcp_sdk_until_a_server_starts():
    loaded = _loaded_after("import macapp.cli.chat, macapp.core.tools.host, macapp.core.tools.loop")
    assert "macapp.core.tools.host" in loaded and "macapp.cli.chat" in loaded  # the check ran
    assert [m for m in loaded if m == "mcp" or m.startswith(("mcp.", "mcp_types"))] == []


def test_one_download_module_loads_without_the_rest_of_the_package():
    loaded = _loaded_after("import macapp.core.download.hfcache")
    assert "macapp.core.download.hfcache" in loaded
    assert {"macapp.core.download.manager", "macapp.core.download.plan", "macapp.core.download.local"}.isdisjoint(loaded)


def test_the_download_package_hands_on_every_name_it_lists_for_the_type_checker():
    tree = ast.parse(Path(download_package.__file__).read_text(encoding="utf-8"))
    checked = next(n for n in tree.body if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING")
    typed = {alias.name: node.module for node in checked.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert typed == download_package._HOMES  # the same name from the same module, at run time and for mypy
    for name in download_package.__all__:
        value = getattr(download_package, name)
        assert getattr(sys.modules[typed[name]], name) is value
