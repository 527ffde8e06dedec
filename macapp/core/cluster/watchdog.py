"""A bound on every wait for the other ranks that rank 0 makes, so that a stuck peer never hangs the app.

MLX's collectives cannot time out: a rank that is alive but stuck (stopped, swapping, deadlocked) would leave
rank 0 waiting forever, and a stop or Ctrl-C with it (the wait is in C++). Rank 0 marks each of its waits; a
thread of its own ends the process with a clear message when one lasts past its limit, and the launcher ends
every other rank. The limits follow what the ranks have shown they need: a command header waits at most for a
peer to finish the call before it, a model call for about as long as the slowest call so far, with generous
floors (the first calls compile and warm up). Loading is bounded too: the model-files check over the group (every
rank reads only safetensors headers) and the sharded load (every rank reads its share from its own disk).
"""

from __future__ import annotations

import enum
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

STALLED = 5  # rank 0's exit status when a peer stopped answering
FIRST_CALL_S = 600.0  # the first model call may warm up for long on a large model
FLOOR_S = 60.0
GAVE_UP = "qwen-desk: the other ranks have not answered for"  # how rank 0's last line starts (the launcher reads it)
FILES_S = 120.0  # the model-files check: every rank has joined and fingerprints headers only
LOAD_S = 1800.0  # a share of a 400 GB build from a slow disk; rank 0's own reading counts in it


class Wait(enum.Enum):
    """What rank 0 waits for the other ranks in; the value is how the message names it."""

    HEADER = "a command"
    CALL = "a model call"
    FILES = "the model-files check"
    LOAD = "loading the model"


class Watchdog:
    def __init__(self, fixed_limit_s: float = 0.0, load_limit_s: float = 0.0):
        """`fixed_limit_s` > 0 replaces the adaptive limits of commands and calls, `load_limit_s` > 0 the
        limits of the files check and the load (tests)."""
        self.fixed = fixed_limit_s
        self.load_limit_s = load_limit_s
        self.slowest_call_s = 0.0
        self._busy: tuple[float, float, Wait] | None = None  # (since, limit, what)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None  # started by the first wait

    def limit(self, what: Wait) -> float:
        if what in (Wait.FILES, Wait.LOAD):
            return self.load_limit_s if self.load_limit_s > 0 else (FILES_S if what is Wait.FILES else LOAD_S)
        if self.fixed > 0:
            return self.fixed
        if what is Wait.CALL and not self.slowest_call_s:
            return FIRST_CALL_S
        return max(FLOOR_S, 10 * self.slowest_call_s)

    @contextmanager
    def waiting(self, what: Wait) -> Iterator[None]:
        """Mark a wait for the other ranks; a call's duration teaches the limits."""
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
            if what is Wait.CALL:
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
                    f"{GAVE_UP} {limit:.0f} s ({what.value}); a host may be stuck or unreachable. Stopping every rank.\n".encode(),
                )
                os._exit(STALLED)
