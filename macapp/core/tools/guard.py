"""Runs one stdio MCP server so that none of its processes outlives the app, even a killed one (SIGKILL).

    python guard.py COMMAND [ARG...]

The host starts every stdio server through this small script (no imports from the app: it starts fast). It
leads a process group of its own, runs the server in it (stdin, stdout and stderr passed through), and takes the
whole group down (SIGTERM, then SIGKILL 2 s later) when the server exits, when it is told to stop (SIGTERM, the
MCP SDK's close), or when the app that started it is gone (its parent changes: a killed app cannot clean up).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

WATCH_S = 0.5  # how often the parent is looked at (a kill of the app is not signalled to us)
GRACE_S = 2.0


def _end_group(child: subprocess.Popen[bytes] | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(os.getpgrp(), signal.SIGTERM)
    except OSError:
        pass
    if child is not None:
        try:
            child.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the server's own children too, and this script last


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: guard.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    if os.getpgrp() != os.getpid():
        os.setsid()
    parent = os.getppid()
    child: subprocess.Popen[bytes] | None = None
    signal.signal(signal.SIGTERM, lambda *_: _end_group(child))
    try:
        child = subprocess.Popen(argv)
    except OSError as exc:
        print(f"cannot start {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    while True:
        try:
            code = child.wait(WATCH_S)
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:
                _end_group(child)
            continue
        _end_group(None)
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
