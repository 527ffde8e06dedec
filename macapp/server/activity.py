"""The server's requests as the window lists them (client, tokens in / reused / out, tok/s, state), the ones it
refused before any work (status and reason), and the jobs in flight, so that a shutdown can stop them all and
let their streams end properly: while `stopping`, a reply cut short says so (503 / an error event), never as a
finished answer.

Updated from the jobs' listeners (on the engine's worker thread); observers are called on that thread too and
must only hand the record on (the window's controller emits a Qt signal).
"""

from __future__ import annotations

import contextvars
import enum
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from macapp.core.events import AnswerDelta, Event, Failed, PromptProgress, ReasoningDelta, StatsUpdate
from macapp.core.serving.requests import Completed, FinishReason, RequestStarted, ToolCallStarted

if TYPE_CHECKING:  # the engine package imports huggingface_hub; the window and the CLI import this module at start-up
    from macapp.core.engine.jobs import Job

log = logging.getLogger(__name__)


class RequestState(enum.Enum):
    WAITING = "waiting"  # queued behind other work on the engine (another request, or the chat)
    READING = "reading"  # prefilling the prompt
    ANSWERING = "answering"
    DONE = "done"
    STOPPED = "stopped"  # the client went away, or the server stopped
    FAILED = "failed"
    REFUSED = "refused"  # answered with an error before any work (bad body, key, Host, size, queue full, ...)

    @property
    def finished(self) -> bool:
        return self in (RequestState.DONE, RequestState.STOPPED, RequestState.FAILED, RequestState.REFUSED)


@dataclass(frozen=True)
class RequestRecord:
    id: int
    client: str
    api: str  # "openai" | "anthropic"
    started_at: float  # time.time()
    state: RequestState = RequestState.WAITING
    prompt_tokens: int = 0  # the whole prompt
    cached_tokens: int = 0  # of it, reused from a checkpoint
    completion_tokens: int = 0
    tokens_per_s: float = 0.0
    mtp_tokens_per_step: float | None = None  # when the MTP head drafted for the reply (tokens per verify pass)
    mtp_acceptance: float | None = None
    error: str = ""
    status: int = 0  # the HTTP status of a refusal (0 for a request that ran)
    cached_from: str = ""  # "memory" or "disk": where the checkpoint of `cached_tokens` was


Observer = Callable[[RequestRecord], None]
# Set by the HTTP front (refusals.RefusalDesk) per request: track() marks it, so an error answer to a request that
# already has a record (a job that failed) is not listed a second time as a refusal.
CURRENT_REQUEST: contextvars.ContextVar[dict[str, bool] | None] = contextvars.ContextVar("qwen_desk_request", default=None)


@dataclass
class Activity:
    keep: int = 100  # finished records kept for the list
    _records: dict[int, RequestRecord] = field(default_factory=dict)
    _jobs: dict[int, Job] = field(default_factory=dict)
    _observers: list[Observer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def stopping(self) -> bool:
        """The server is shutting down: what it stops now was cut short, not finished."""
        return self._stopping.is_set()

    def open(self) -> None:
        """The server (re)starts serving (the window starts and stops one server after another on one Activity)."""
        self._stopping.clear()

    def add_observer(self, observer: Observer) -> None:
        with self._lock:
            self._observers.append(observer)

    def remove_observer(self, observer: Observer) -> None:
        with self._lock:
            self._observers = [o for o in self._observers if o is not observer]

    def records(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records.values())

    def busy(self) -> bool:
        """A server request is in flight (queued or running)."""
        with self._lock:
            return bool(self._jobs)

    def track(self, job: Job, client: str, api: str, prompt_tokens: int) -> RequestRecord:
        """Follow `job` from now on; returns its first record."""
        if (current := CURRENT_REQUEST.get()) is not None:
            current["tracked"] = True
        with self._lock:
            record = RequestRecord(next(self._ids), client, api, time.time(), prompt_tokens=prompt_tokens)
            self._records[record.id] = record
            self._jobs[record.id] = job
            self._trim()
        self._notify(record)
        job.add_listener(lambda event: self._on_event(record.id, event))
        return record

    def refused(self, client: str, api: str, status: int, reason: str) -> RequestRecord:
        """A request answered with an error before it reached the engine: listed with its status and reason."""
        with self._lock:
            record = RequestRecord(next(self._ids), client, api, time.time(), state=RequestState.REFUSED, error=reason, status=status)
            self._records[record.id] = record
            self._trim()
        self._notify(record)
        return record

    def shut_down(self) -> None:
        """Mark the server as stopping, then stop every job in flight (each ends as cut short by the shutdown)."""
        self._stopping.set()
        self.stop_all()

    def stop_all(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.stop()

    def _trim(self) -> None:  # under the lock
        while len(self._records) > self.keep:
            oldest = next(iter(self._records))
            if oldest in self._jobs:
                break
            del self._records[oldest]

    def _on_event(self, record_id: int, event: Event) -> None:
        with self._lock:
            record = self._records.get(record_id)
            if record is None:
                return
            updated = _apply(record, event)
            if updated.state is RequestState.STOPPED and record.state is not RequestState.STOPPED and self.stopping:
                updated = replace(updated, error="the server stopped")
            if updated is record:
                return
            self._records[record_id] = updated
            if updated.state.finished:
                self._jobs.pop(record_id, None)
        self._notify(updated)

    def _notify(self, record: RequestRecord) -> None:
        with self._lock:
            observers = list(self._observers)
        for observer in observers:
            try:
                observer(record)
            except Exception:  # a broken view must not break the server; its bug goes to the log
                log.exception("request list observer %r failed", observer)


def _apply(record: RequestRecord, event: Event) -> RequestRecord:
    """The record after one event (the same object when nothing the list shows changed)."""
    match event:
        case RequestStarted(prompt_tokens=prompt, cached_tokens=cached, cached_from=source):
            return replace(record, state=RequestState.READING, prompt_tokens=prompt, cached_tokens=cached, cached_from=source)
        case PromptProgress() if record.state is RequestState.WAITING:
            return replace(record, state=RequestState.READING)
        case ReasoningDelta() | AnswerDelta() | ToolCallStarted() if record.state is not RequestState.ANSWERING:
            return replace(record, state=RequestState.ANSWERING)
        case StatsUpdate(stats=stats):
            return replace(record, completion_tokens=stats.generation_tokens, tokens_per_s=stats.generation_tps)
        case Completed(usage=usage):
            state = RequestState.STOPPED if event.finish_reason is FinishReason.CANCELLED else RequestState.DONE
            return replace(
                record,
                state=state,
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.cached_tokens,
                completion_tokens=usage.completion_tokens,
                tokens_per_s=event.generation_tps,
                mtp_tokens_per_step=event.mtp_tokens_per_step,
                mtp_acceptance=event.mtp_acceptance,
            )
        case Failed(message=message):
            return replace(record, state=RequestState.FAILED, error=message)
    return record
