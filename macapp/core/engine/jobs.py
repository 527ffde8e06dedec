"""A Job: one unit of work on the engine's worker thread and the ordered stream of events it reports.

The worker emits; any thread reads (`events()`, `wait()`, `result()`) or listens (`add_listener`). The small
worker-side API (`stop_event`, `arm_early_reply`, `disarm_early_reply`, `settle`) is what the turn code uses
to honour a stop while a prompt is being read.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import Callable, Iterator

from macapp.core.engine.errors import EngineError
from macapp.core.event_log import EventLog
from macapp.core.events import Event, Failed, Finished, Reply, TerminalEvent

log = logging.getLogger(__name__)

NOTIFY_INTERVAL_S = 0.02  # a blocked events() reader sees text deltas within this (Job.emit)


class _Listener:
    """One listener's queue of undelivered events; whichever thread holds `busy` delivers them, in order."""

    def __init__(self, callback: Callable[[Event], None]):
        self.callback = callback
        self.pending: collections.deque[Event] = collections.deque()  # filled under the job's lock
        self.busy = threading.Lock()

    def deliver(self) -> None:
        # Never blocks: if another thread is delivering, it also delivers what was just queued (the
        # re-check after releasing closes the gap between its last pop and its release).
        while self.pending and self.busy.acquire(blocking=False):
            try:
                while self.pending:
                    event = self.pending.popleft()
                    try:
                        self.callback(event)
                    except Exception:  # a listener's bug must not kill the worker; it goes to the log
                        log.exception("job listener %r failed on %s", self.callback, type(event).__name__)
            finally:
                self.busy.release()


class Job:
    """A unit of work on the worker thread and the stream of events it reports."""

    _ids = itertools.count(1)

    def __init__(self, kind: str):
        self.id = next(self._ids)
        self.kind = kind
        self._log = EventLog("the engine", wake_every=NOTIFY_INTERVAL_S)
        self._cond = self._log.lock  # also guards the listeners and the early reply, in the log's order
        self._listeners: list[_Listener] = []
        self._stop = threading.Event()
        self._early_reply: TerminalEvent | None = None  # while a prompt is read: the terminal event stop() may emit at once
        self._settled = threading.Event()  # the worker is done with this job (see join())
        self.stop_requested_at: float | None = None

    # -- producer side (worker thread) -----------------------------------------------------------------
    def emit(self, event: Event) -> None:
        with self._cond:
            if not self._log.add(event):  # nothing after the terminal event (stop() may have sent it early)
                return
            listeners = self._listeners
            for listener in listeners:  # queued under the lock: each listener's order is the job's order
                listener.pending.append(event)
        for listener in listeners:
            listener.deliver()

    @property
    def stop_event(self) -> threading.Event:
        """Set once stop() was called; the worker polls `stop_event.is_set` (cheap enough for every token)."""
        return self._stop

    def arm_early_reply(self, event: TerminalEvent) -> bool:
        """Let stop() answer with `event` at once, from a helper thread, while the worker is busy (reading a
        prompt). True if the job already ended."""
        with self._cond:
            self._early_reply = event
            return self._log.done

    def disarm_early_reply(self) -> bool:
        """Take back arm_early_reply's event; True if stop() already sent it (or the job ended otherwise)."""
        with self._cond:
            self._early_reply = None
            return self._log.done

    def settle(self) -> None:
        """The worker is done with this job (after its terminal event, and after any undo): join() returns."""
        self._settled.set()

    # -- consumer side (any thread) --------------------------------------------------------------------
    def add_listener(self, callback: Callable[[Event], None]) -> None:
        """Call `callback(event)` for every event of the job, each once and in order, the terminal one last.

        Past events are delivered now, on this thread; new ones on the thread that emits them (the worker),
        except that events arriving while this thread is still delivering are delivered by it, after the
        ones before them. A callback must not wait for the job: it may run on the worker. A callback that
        raises is logged (with its traceback) and keeps getting the later events."""
        listener = _Listener(callback)
        with self._cond:
            listener.pending.extend(self._log.history)
            self._listeners = [*self._listeners, listener]
        listener.deliver()

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Every event of this job, blocking until the terminal one (TimeoutError after `timeout` idle seconds)."""
        return self._log.events(timeout)

    def wait(self, timeout: float | None = None) -> TerminalEvent:
        """Block until the job ends; return its terminal event."""
        return self._log.wait(timeout)

    def join(self, timeout: float | None = None) -> None:
        """Block until the worker is done with this job (after a stop while reading, Finished comes first)."""
        if not self._settled.wait(timeout):
            raise TimeoutError(f"the engine did not finish in {timeout} s")

    def result(self, timeout: float | None = None) -> Reply | TerminalEvent:
        """The Reply (chat), Loaded (load) or Unloaded; raises EngineError on Failed."""
        last = self.wait(timeout)
        if isinstance(last, Failed):
            raise EngineError(last.message, last.code)
        if isinstance(last, Finished):
            return last.reply
        return last

    def stop(self) -> None:
        """Ask the job to stop. While a prompt is being read, its Finished(kept=False) comes at once (from a
        helper thread); the worker undoes the turn when the chunk in flight is done, before any later job."""
        if not self._stop.is_set():
            self.stop_requested_at = time.perf_counter()
            self._stop.set()
        with self._cond:
            early, self._early_reply = self._early_reply, None
        if early is not None:  # from a helper thread, so no listener runs inside the caller's stop()
            threading.Thread(target=self.emit, args=(early,), name="qwen-desk-stop", daemon=True).start()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def done(self) -> bool:
        return self._log.done

    @property
    def history(self) -> list[Event]:
        return self._log.history
