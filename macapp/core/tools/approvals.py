"""Which tool calls run without asking: the user's "Always allow this tool" answers, per server and tool, kept in
`<app home>/mcp_approvals.json` and revocable; and, for a run without a terminal, the `--allow-tool SERVER/TOOL`
patterns (`SERVER/*` for all of one server's tools)."""

from __future__ import annotations

import enum
import json
import logging
import os
import tempfile
import threading
from pathlib import Path

from macapp.core.paths import app_home

log = logging.getLogger(__name__)

APPROVALS_NAME = "mcp_approvals.json"


class Decision(enum.Enum):
    ALLOW_ONCE = "allow_once"
    ALWAYS = "always"  # allow, and remember it for this server and tool
    DENY = "deny"

    @property
    def allowed(self) -> bool:
        return self is not Decision.DENY


def approvals_path() -> Path:
    return app_home() / APPROVALS_NAME


class Approvals:
    """The remembered "always allow" answers (server, MCP tool name). `path` None: kept in memory only."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._always: set[tuple[str, str]] = set()
        if path is not None:
            self._always = self._read(path)

    @staticmethod
    def _read(path: Path) -> set[tuple[str, str]]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return set()
        except (OSError, ValueError) as exc:
            log.warning("%s: cannot be read (%s); no tool is allowed without asking", path, exc)
            return set()
        items = data.get("always", []) if isinstance(data, dict) else []
        return {(i["server"], i["tool"]) for i in items if isinstance(i, dict) and isinstance(i.get("server"), str) and isinstance(i.get("tool"), str)}

    def always(self, server: str, tool: str) -> bool:
        with self._lock:
            return (server, tool) in self._always

    def remembered(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(self._always)

    def remember(self, server: str, tool: str) -> None:
        with self._lock:
            self._always.add((server, tool))
            self._save()

    def revoke(self, server: str, tool: str) -> None:
        with self._lock:
            self._always.discard((server, tool))
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        data = {"always": [{"server": s, "tool": t} for s, t in sorted(self._always)]}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".mcp_approvals.")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("Could not save the tool approvals to %s: %s", self.path, exc)


def parse_allowed(patterns: list[str]) -> list[tuple[str, str]]:
    """`--allow-tool SERVER/TOOL` values as (server, tool) pairs, tool "*" for all; ValueError for a malformed one."""
    out = []
    for pattern in patterns:
        server, sep, tool = pattern.partition("/")
        if not sep or not server or not tool:
            raise ValueError(f"--allow-tool {pattern!r}: expected SERVER/TOOL or SERVER/*")
        out.append((server, tool))
    return out


def pattern_allows(patterns: list[tuple[str, str]], server: str, tool: str) -> bool:
    return any(s == server and t in ("*", tool) for s, t in patterns)
