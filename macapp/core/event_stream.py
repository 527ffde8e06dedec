"""An ordered stream of events that ends with a terminal one: one thread emits, any thread reads, waits or listens.

An engine Job (engine/jobs.py) and a conversation's Turn (conversation.py) are both one: `emit` on the producing
thread (the engine's worker, a conversation's recording thread); `events()` to follow, `wait()` for the terminal
event, `add_listener` for a callback per event, `history` and `done` to look.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Iterator

from macapp.core.events import AnswerDelta, Event, ReasoningDelta, TerminalEvent

log = logging.getLogger(__name__)

POLL_S = 0.02  # a blocked reader looks again this often: a text piece may not wake it (see `emit`)
_TEXT_PIECES = (AnswerDelta, ReasoningDelta)

Listener = Callable[[Event], None]


class _Delivery:
    """One listener's queue of undelivered events; whichever thread holds `busy` delivers them, in order."""

    def __init__(self, callback: Listener, what: str):
        self.callback = callback
        self.what = what
        self.pending: collections.deque[Event] = collections.deque()  # filled under the stream's lock
        self.busy = threading.Lock()

    def deliver(self) -> None:
        # Never blocks: if another thread is delivering, it also delivers what was just queued (the re-check after
        # releasing closes the gap between its last pop and its release).
        while self.pending and self.busy.acquire(blocking=False):
            try:
                while self.pending:
                    event = self.pending.popleft()
                    try:
                        self.callback(event)
                    except Exception:  # a listener's bug must not kill the producer nor starve the others
                        log.exception("%s: listener %r failed on %s", self.what, self.callback, type(event).__name__)
            finally:
                self.busy.release()


class EventStream:
    """The events so far (`history`), `done` once the terminal one is in; nothing is taken after it.

    `what` names the producer in a TimeoutError and a listener's logged failure ("the engine", "the turn").
    `wake_every`: a text piece wakes blocked readers at most this often (a thread switch per token costs generation
    time; they poll anyway); any other event wakes them at once. `lock` (reentrant) is held while an event goes in:
    a subclass keeps state under it that must change in step with the events (Job's early reply)."""

    def __init__(self, what: str, wake_every: float = 0.0) -> None:
        self.what = what
        self.wake_every = wake_every
        self.lock = threading.Condition(threading.RLock())
        self._events: list[Event] = []
        self._done = False  # the terminal event is in
        self._served = False  # ... and the emitting thread has handed it to the listeners (wait() returns)
        self._deliveries: list[_Delivery] = []  # replaced, never changed in place: emit reads it outside the lock
        self._waiting = 0  # readers blocked in events()
        self._last_wake = 0.0

    # -- producer side (one thread) ----------------------------------------------------------------------------
    def emit(self, event: Event) -> None:
        """Append `event` and hand it to every listener; nothing is done once the terminal event is in.

        The listeners are called on this thread, after the lock is released, except one that another thread is
        delivering to at the time: that thread delivers this event too, after the ones before it."""
        terminal = isinstance(event, TerminalEvent)
        with self.lock:
            if self._done:
                return
            self._events.append(event)
            deliveries = self._deliveries
            for delivery in deliveries:  # queued under the lock: each listener's order is the stream's order
                delivery.pending.append(event)
            if terminal:
                self._done = True
                self.lock.notify_all()
            elif self._waiting:
                now = time.perf_counter()
                if now - self._last_wake >= self.wake_every or not isinstance(event, _TEXT_PIECES):
                    self._last_wake = now
                    self.lock.notify_all()
        for delivery in deliveries:
            delivery.deliver()
        if terminal:
            with self.lock:
                self._served = True
                self.lock.notify_all()

    # -- consumer side (any thread) ----------------------------------------------------------------------------
    def add_listener(self, callback: Listener) -> None:
        """Call `callback(event)` for every event, each once and in order, the terminal one last.

        Past events are delivered now, on this thread; new ones on the thread that emits them, except that events
        arriving while this thread is still delivering are delivered by it, after the ones before them. A callback
        must be quick and must not wait for the stream (it may run on its producer). One that raises is logged
        (with its traceback) and keeps getting the later events; the other listeners are served all the same."""
        delivery = _Delivery(callback, self.what)
        with self.lock:
            delivery.pending.extend(self._events)
            self._deliveries = [*self._deliveries, delivery]
        delivery.deliver()

    @property
    def done(self) -> bool:
        """The terminal event is in."""
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
        """Block until the terminal event is in and the emitting thread has handed it to the listeners; return it
        (TimeoutError after `timeout`). So a listener fed on that thread (a window's bridge) has it when this returns."""
        with self.lock:
            if not self.lock.wait_for(lambda: self._served, timeout):
                raise TimeoutError(f"{self.what} did not finish in {timeout} s")
            last = self._events[-1]
        assert isinstance(last, TerminalEvent)  # emit() sets done with it
        return last
