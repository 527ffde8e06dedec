"""An ordered log of events that ends with a terminal one: one thread appends, any thread reads or waits.

Both an engine Job (engine/jobs.py) and a conversation's Turn (conversation.py) report through one: the events in
order, `events()` to follow them, `wait()` for the terminal one. Their owners keep their own listeners, under
`lock` (reentrant), so that an event is queued to them in the log's order.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator

from macapp.core.events import AnswerDelta, Event, ReasoningDelta, TerminalEvent

POLL_S = 0.02  # a blocked reader looks again this often: a text piece may not wake it (see `add`)
_TEXT_PIECES = (AnswerDelta, ReasoningDelta)


class EventLog:
    """The events so far (`history`), `done` once the terminal one is in. `what` names it in a TimeoutError
    ("the engine", "the turn"). `wake_every`: a text piece wakes blocked readers at most this often (a thread
    switch per token costs generation time; they poll anyway); any other event wakes them at once."""

    def __init__(self, what: str, wake_every: float = 0.0) -> None:
        self.what = what
        self.wake_every = wake_every
        self.lock = threading.Condition(threading.RLock())
        self._events: list[Event] = []
        self._done = False
        self._waiting = 0  # readers blocked in events()
        self._last_wake = 0.0

    def add(self, event: Event) -> bool:
        """Append `event`; False (and nothing appended) once the terminal event is in."""
        with self.lock:
            if self._done:
                return False
            self._events.append(event)
            if isinstance(event, TerminalEvent):
                self._done = True
                self.lock.notify_all()
            elif self._waiting:
                now = time.perf_counter()
                if now - self._last_wake >= self.wake_every or not isinstance(event, _TEXT_PIECES):
                    self._last_wake = now
                    self.lock.notify_all()
            return True

    @property
    def done(self) -> bool:
        return self._done

    @property
    def history(self) -> list[Event]:
        with self.lock:
            return list(self._events)

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Every event, blocking until the terminal one (TimeoutError after `timeout` idle seconds)."""
        i = 0
        while True:
            with self.lock:
                waited = 0.0
                while i >= len(self._events):
                    if self._done:
                        return
                    if timeout is not None and waited >= timeout:
                        raise TimeoutError(f"no event from {self.what} in {timeout} s")
                    self._waiting += 1
                    try:
                        self.lock.wait(POLL_S)
                    finally:
                        self._waiting -= 1
                    waited += POLL_S
                batch = self._events[i:]
            i += len(batch)
            yield from batch

    def wait(self, timeout: float | None = None) -> TerminalEvent:
        """Block until the terminal event is in; return it (TimeoutError after `timeout`)."""
        with self.lock:
            if not self.lock.wait_for(lambda: self._done, timeout):
                raise TimeoutError(f"{self.what} did not finish in {timeout} s")
            last = self._events[-1]
        assert isinstance(last, TerminalEvent)  # add() sets done with it
        return last
