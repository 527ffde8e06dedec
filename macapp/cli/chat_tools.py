"""`qwen-desk chat`'s MCP tools (macapp.core.tools): its flags, the servers it runs, how it asks before a call.

Interactively (no --prompt) each call not allowed already is shown (server, tool, arguments as JSON) and asked
about: once, always (remembered, like the window's), or deny. Without a terminal (--prompt, --json) only the tools
that --allow-tool names run; the rest are denied and the model is told so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from macapp.cli import UsageError
from macapp.core.events import ToolCallRecord
from macapp.core.jsonvalue import JSONObject
from macapp.core.tools.approvals import Approvals, Decision, approvals_path, parse_allowed
from macapp.core.tools.config import ConfigError, config_path, read_config
from macapp.core.tools.host import DEFAULT_TIMEOUT_S, McpHost
from macapp.core.tools.loop import ApprovalRequest, ToolLoop, ToolPolicy

ANSWERS = {"o": Decision.ALLOW_ONCE, "once": Decision.ALLOW_ONCE, "a": Decision.ALWAYS, "always": Decision.ALWAYS, "d": Decision.DENY, "deny": Decision.DENY}


def add_tool_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mcp-config", metavar="FILE", type=Path, help="MCP servers to use (default: mcp.json in the app's folder)")
    parser.add_argument(
        "--allow-tool", action="append", metavar="SERVER/TOOL", help="run this MCP tool without asking (SERVER/* for all of a server's); repeat"
    )
    parser.add_argument(
        "--mcp-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS", help=f"most seconds a tool call may take (default {DEFAULT_TIMEOUT_S:g})"
    )


def tool_loop(args: argparse.Namespace, interactive: bool) -> ToolLoop | None:
    """The chat's tool loop, None without servers; UsageError for a malformed config or flag (before any model loads)."""
    try:
        allowed = parse_allowed(args.allow_tool or [])
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.mcp_timeout <= 0:
        raise UsageError("--mcp-timeout must be more than 0 seconds")
    path = args.mcp_config or config_path()
    if args.mcp_config is not None and not path.exists():
        raise UsageError(f"--mcp-config {path}: no such file")
    try:
        servers = read_config(path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if not servers:
        return None
    policy = ToolPolicy(Approvals(approvals_path()), ask=ask_in_terminal if interactive else None, allowed=allowed)
    return ToolLoop(McpHost(servers, timeout_s=args.mcp_timeout), policy, warn=lambda text: print(f"qwen-desk: {text}", file=sys.stderr))


def ask_in_terminal(request: ApprovalRequest, out: TextIO = sys.stderr) -> Decision:
    """Show the call and ask; anything but once / always is a deny."""
    print(f"\n[tool call] {request.server} / {request.tool} with arguments:\n{request.arguments_json}", file=out)
    try:
        answer = input("Run it? (o)nce / (a)lways for this tool / (d)eny: ").strip().lower()
    except (EOFError, KeyboardInterrupt):
        answer = "d"
    return ANSWERS.get(answer, Decision.DENY)


def show_call(record: ToolCallRecord, out: TextIO) -> None:
    """One line after a call: what ran (or not) and how it ended."""
    if not record.allowed:
        state = "denied"
    elif record.timed_out:
        state = "timed out"
    else:
        state = f"{'error' if record.is_error else 'done'} in {record.elapsed_s:.2f} s, {len(record.result or '')} characters"
    print(f"[tool {record.server}/{record.name}: {state}]", file=out)


def json_calls(records: list[ToolCallRecord]) -> list[JSONObject]:
    """The --json turn object's `tool_calls`: server, name, arguments, allowed, result (None when denied), and more."""
    return [r.to_json() for r in records]
