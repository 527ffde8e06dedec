"""A bound on every wait for the other ranks that rank 0 makes, so that a stuck peer never hangs the app.

MLX's collectives cannot time out: a rank that is alive but stuck (stopped, swapping, deadlocked) would leave
rank 0 waiting forever, and a stop or Ctrl-C with it (the wait is in C++). Rank 0 marks each of its waits; a
thread of its own ends the process with a clear message when one lasts past its limit, and the launcher ends
every other rank. The limits follow what the ranks have shown they need: a command header waits at most for a
peer to finish the call before it, a model call for about as long as the slowest call so far, with generous
floors (the first calls compile and warm up).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

STALLED = 5  # rank 0's exit status when a peer stopped answering
FIRST_CALL_S = 600.0  # the first model call may warm up for long on a large model
FLOOR_S = 60.0


class Watchdog:
    def __init__(self, fixed_limit_s: float = 0.0):
        """`fixed_limit_s` > 0 replaces the adaptive limits (tests)."""
        self.fixed = fixed_limit_s
        self.slowest_call_s = 0.0
        self._busy: tuple[float, float, str] | None = None  # (since, limit, what)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None  # started by the first wait

    def limit(self, what: str) -> float:
        if self.fixed > 0:
            return self.fixed
        if what == "call" and not self.slowest_call_s:
            return FIRST_CALL_S
        return max(FLOOR_S, 10 * self.slowest_call_s)

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Mark a wait for the other ranks ("header" or "call"); a call's duration teaches the limits."""
        start = time.monotonic()
        with self._lock:
            self._busy = (start, self.limit(what), what)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="lockstep-watchdog", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._busy = None
            if what == "call":
                self.slowest_call_s = max(self.slowest_call_s, time.monotonic() - start)

    def _watch(self) -> None:
        while True:
            time.sleep(0.25)
            with self._lock:
                busy = self._busy
            if busy is not None and time.monotonic() - busy[0] > busy[1]:
                since, limit, what = busy
                os.write(
                    sys.stderr.fileno(),
                    f"qwen-desk: the other ranks have not answered for {limit:.0f} s (a {'model call' if what == 'call' else 'command'}); "
                    "a host may be stuck or unreachable. Stopping every rank.\n".encode(),
                )
                os._exit(STALLED)
