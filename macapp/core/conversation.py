"""One conversation as a plain model (no Qt): its engine session, the recorder that keeps its history, its turns.

Both front ends drive it and only show what it reports (napari's pattern: Qt-free models under thin views); the
window's ChatController wires a turn's events to widgets, `qwen-desk chat` to prints:

    conversation = ConversationModel(new_session, recorder=ChatRecorder(store, model=...))
    turn = conversation.start(TurnKind.SEND, "Hello", thinking=True, sampling=params, images=pictures)
    for event in turn.events(): show(event)          # or turn.add_listener(callback): an EventBridge
    turn.outcome                                    # the recorder's TurnOutcome (None when nothing is recorded)

Where the work runs. `start` only submits the session's job (nothing blocks the caller's thread). The job's
events go, on the thread that emits them (the engine's worker, running the batch loop), to
this conversation's recording thread, which handles them one at a time, in the job's order:
- first of all, at once, the turn's start is committed (a send's message, its pictures saved as PNG and fsynced:
  ChatRecorder.begin), even while the engine is still busy with other work;
- each event is recorded before anyone else sees it: `turn.events()` and a turn's listeners get it after the recorder;
- after the terminal one of a turn that kept no reply or failed, a session that no longer holds what the history
  holds is set aside and the history's messages are read for the next session, before the terminal event is passed on.
So a front end's own thread never writes the history nor encodes a picture for a turn. A conversation's turns are
recorded one at a time, in the order they were started and their events came (a turn still open when the next one
starts is kept as it stands: ChatRecorder.begin).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from macapp.core.event_stream import EventStream
from macapp.core.events import AnswerDelta, Event, Finished, ReasoningDelta, TerminalEvent, TurnKind
from macapp.core.history import Conversation
from macapp.core.tools.rounds import has_tool_rounds, without_rounds
from macapp.core.recorder import ChatRecorder, RecordedTurn, TurnOutcome, TurnResult, run_on

if TYPE_CHECKING:
    from macapp.core.engine.jobs import Job
    from macapp.core.engine.session import ChatSession
    from macapp.core.vision.images import PreparedImage

log = logging.getLogger(__name__)

IDLE_EXIT_S = 2.0  # the recording thread ends after this long without work (a new turn starts it again)
WAKE_INTERVAL_S = 0.02  # text pieces wake it at most this often: a thread switch per token costs generation time
SETTLE_WAIT_S = 5.0  # how long the session check waits for the worker to finish undoing a turn

TEXT_PIECES = (AnswerDelta, ReasoningDelta)
TurnRunner = Callable[..., "Job"]  # (session, kind, text, thinking=, **options) -> the turn's Job, as recorder.run_on
SessionFactory = Callable[[str | None, list[dict[str, object]] | None], "ChatSession"]  # (system prompt, messages) -> a ChatSession


def starts_reply(event: Event) -> bool:
    """Whether `event` puts a reply under way (the recorder's rule: its first text piece, or a kept Finished)."""
    return isinstance(event, (AnswerDelta, ReasoningDelta)) or (isinstance(event, Finished) and event.reply.kept)


@dataclass(frozen=True)
class _Seed:
    """What the next session reads once: a saved conversation's system prompt and messages."""

    system_prompt: str | None
    messages: list[dict[str, object]] | None


class _Serial:
    """Runs callables one at a time, in the order given, on a thread of its own that ends when idle."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._cond = threading.Condition()
        self._running = False
        self._last_wake = 0.0

    def put(self, work: Callable[[], None], urgent: bool = True) -> None:
        """Queue `work` (any thread; cheap enough for every token). Not `urgent`: it may wait up to WAKE_INTERVAL_S."""
        with self._cond:
            self._queue.append(work)
            if self._running:
                now = time.monotonic()
                if urgent or now - self._last_wake >= WAKE_INTERVAL_S:
                    self._last_wake = now
                    self._cond.notify()
                return
            self._running = True
        threading.Thread(target=self._drain, name=self.name, daemon=True).start()

    def _drain(self) -> None:
        idle_since = time.monotonic()
        while True:
            with self._cond:
                while not self._queue:  # woken by put(), or polling for work queued without a wake
                    if time.monotonic() - idle_since >= IDLE_EXIT_S:
                        self._running = False
                        return
                    self._cond.wait(WAKE_INTERVAL_S)
                work = self._queue.popleft()
            try:
                work()
            except Exception:  # a bug here must not stop the turns queued after it; it goes to the log
                log.exception("conversation work %r failed", work)
            del work  # an idle thread holds no turn (nor its job and session) alive
            idle_since = time.monotonic()


class Turn(EventStream):
    """One turn: the session's job and what the recorder made of it. An EventStream (event_stream.py) of the job's
    events, each emitted on the recording thread once the recorder has it (`events()`, `add_listener`, `wait()`);
    the terminal one comes last, once recorded and the session checked."""

    def __init__(self, conversation: ConversationModel, kind: TurnKind, text: str, thinking: bool, images: tuple[PreparedImage, ...]) -> None:
        super().__init__("the turn")
        self.conversation = conversation
        self.kind = kind
        self.text = text
        self.thinking = thinking
        self.images = images
        self.job: Job  # the session's Job (set by ConversationModel.start, before anyone sees the turn)
        self.session: ChatSession  # the session that runs it (likewise)
        self.recorded: RecordedTurn | None = None  # None until its start is recorded, and when nothing records it
        self.record_error: BaseException | None = None  # the turn's start could not be saved (and, strict, it was stopped)
        self._outcome: TurnOutcome | None = None  # set here only when the start could not be saved

    @property
    def outcome(self) -> TurnOutcome | None:
        """The recorder's outcome once the terminal event was recorded (None before, and when nothing records)."""
        if self._outcome is not None:
            return self._outcome
        return self.recorded.outcome if self.recorded is not None else None

    def stop(self) -> None:
        """Ask the engine to stop the reply; what it wrote is kept (the recorder's rules)."""
        self.job.stop()

    def abandon(self) -> None:
        """No more events will be recorded (the app closes before the turn ended): keep what it wrote as stopped."""
        if self.recorded is not None:
            self.recorded.abandon()


class ConversationModel:
    """A conversation's session, its recorder (None: nothing is recorded) and its turns; see the module docstring.

    `new_session(system_prompt, messages)` makes a session on the front end's engine and options. `system_wins`:
    the front end's system prompt is used over a saved conversation's (the command line's --system); otherwise the
    conversation's own wins and the front end's is the default for a new one (the window's setting). `strict`: a
    turn whose start cannot be saved is stopped and undone (the window keeps what was typed); otherwise it runs
    unrecorded and `recorder.error` says why (the command line goes on)."""

    def __init__(
        self,
        new_session: SessionFactory,
        recorder: ChatRecorder | None = None,
        *,
        system_prompt: str | None = None,
        session: ChatSession | None = None,
        saved: Conversation | None = None,
        system_wins: bool = False,
        strict: bool = False,
        run_turn: TurnRunner = run_on,
    ) -> None:
        self.new_session = new_session
        self.run_turn = run_turn  # run_on, or a tools.loop.ToolLoop's run (a turn that may call MCP tools)
        self.recorder = recorder
        self.system_prompt = system_prompt
        self.system_wins = system_wins
        self.strict = strict
        self._lock = threading.Lock()
        self._session = session
        self._seed: _Seed | None = None  # what the next session reads, once ready
        self._seed_ready: threading.Event | None = None  # set when _seed is (read on the recording thread)
        self._serial = _Serial("qwen-desk-record")
        if saved is not None:
            self._read_seed(saved)

    # -- the session
    @property
    def conversation_id(self) -> int | None:
        return self.recorder.conversation_id if self.recorder is not None else None

    @property
    def session(self) -> ChatSession | None:
        """The session the next turn runs on; None until one is needed (a saved conversation is read into it then)."""
        with self._lock:
            return self._session

    @session.setter
    def session(self, session: ChatSession | None) -> None:
        """Set (or, with None, drop) the session: a dropped one is made again from the history for the next turn
        (read now on the recording thread, after what is still being recorded)."""
        with self._lock:
            self._session = session
        if session is None and self.conversation_id is not None:
            self._read_seed()

    def ensure_session(self) -> ChatSession:
        """The session, made now if there is none: from the saved conversation's messages (read, pictures and all,
        on the recording thread when it was opened or its session set aside; waited for if not ready yet), else empty."""
        with self._lock:
            ready = self._seed_ready if self._session is None else None
        if ready is not None:
            ready.wait(SETTLE_WAIT_S)
        with self._lock:
            if self._session is None:
                seed = self._seed
                recorder = self.recorder
                if seed is None and recorder is not None and recorder.conversation_id is not None:  # not read in time: read it here
                    seed = self._seed_of(recorder.store.get_conversation(recorder.conversation_id))
                seed = seed or _Seed(self.system_prompt, None)
                self._session = self.new_session(seed.system_prompt, seed.messages)
                self._seed, self._seed_ready = None, None
            return self._session

    def _read_seed(self, saved: Conversation | None = None) -> None:
        """Read what the next session reads (`saved`, else the history's copy) on the recording thread."""
        ready = threading.Event()
        recorder = self.recorder
        with self._lock:
            self._seed, self._seed_ready = None, ready

        def read() -> None:
            try:
                conversation = saved
                if conversation is None and recorder is not None and recorder.conversation_id is not None:
                    conversation = recorder.store.get_conversation(recorder.conversation_id)
                seed = self._seed_of(conversation) if conversation is not None else None
            except Exception as exc:  # noqa: BLE001 - read again when the session is made
                log.warning("Could not read the conversation for its next session: %s", exc)
                seed = None
            with self._lock:
                if self._seed_ready is ready:
                    self._seed = seed
            ready.set()

        self._serial.put(read)

    def _seed_of(self, conversation: Conversation) -> _Seed:
        own, saved = self.system_prompt, conversation.system_prompt
        system = (own if own is not None else saved) if self.system_wins else (saved or own)
        return _Seed(system, conversation.chat_messages(include_system=False))

    # -- turns
    def start(self, kind: TurnKind, text: str = "", *, thinking: bool, images: tuple[PreparedImage, ...] = (), **options: Any) -> Turn:
        """Run a turn (send / regenerate / edit) on the session with `options` (sampling, thinking_budget); returns
        at once. `images`: a send's pictures (vision.images.PreparedImage). Raises what the session raises."""
        images = tuple(images) if kind is TurnKind.SEND else ()
        session = self.ensure_session()
        if kind is not TurnKind.SEND and has_tool_rounds(session.messages) and self.conversation_id is not None:
            # a redo answers the user's own message again: a session from the history's copy, its last rounds folded
            self.session = None
            saved = self.ensure_session()
            session = self.new_session(saved.system_prompt, without_rounds(saved.messages))
            self.session = session
        turn = Turn(self, kind, text, thinking, images)
        extra = {"images": images} if images else {}
        turn.session = session
        turn.job = self.run_turn(session, kind, text, thinking=thinking, **options, **extra)
        recorder = self.recorder
        serial = self._serial
        if recorder is not None:  # first: a send's message is saved now, even while the engine is busy with other work
            serial.put(lambda: self._begin(turn, recorder))
        turn.job.add_listener(lambda event: serial.put(lambda: self._record(turn, recorder, event), urgent=not isinstance(event, TEXT_PIECES)))
        return turn

    def _record(self, turn: Turn, recorder: ChatRecorder | None, event: Event) -> None:
        """On the recording thread: record one event of `turn` (its start was recorded first), then pass it on."""
        if turn.recorded is not None:
            turn.recorded.feed(event)
        if isinstance(event, TerminalEvent):
            self._check_session(turn, recorder)
        turn.emit(event)

    def _begin(self, turn: Turn, recorder: ChatRecorder) -> None:
        try:
            turn.recorded = recorder.begin(turn.kind, turn.text, thinking=turn.thinking, images=turn.images)
        except Exception as exc:  # noqa: BLE001 - the turn goes on unrecorded, or (strict) is undone; said either way
            log.warning("Could not record the turn's start: %s", exc)
            turn.record_error = exc
            if self.strict:
                turn._outcome = TurnOutcome(turn.kind, TurnResult.UNDONE, turn.text, error=str(exc), code="history")
                turn.job.stop()
            else:
                recorder.error = exc

    def _check_session(self, turn: Turn, recorder: ChatRecorder | None) -> None:
        """After a turn that kept no reply or failed: a session that no longer agrees with the history is set
        aside; the next turn reads the history's messages (read here) into a new one."""
        outcome = turn.outcome
        if recorder is None or outcome is None or outcome.result not in (TurnResult.UNDONE, TurnResult.FAILED):
            return
        try:
            turn.job.join(SETTLE_WAIT_S)  # the worker may still be undoing the turn in the session
        except TimeoutError:
            pass
        try:
            if recorder.agrees_with(turn.session.messages):
                return
            saved = recorder.store.get_conversation(recorder.conversation_id) if recorder.conversation_id is not None else None
            seed = self._seed_of(saved) if saved is not None else _Seed(self.system_prompt, None)
        except Exception as exc:  # noqa: BLE001 - the history could not be read: start over from it later
            log.warning("Could not compare the session with the history: %s", exc)
            seed = None
        with self._lock:
            if self._session is turn.session:
                self._session = None
                self._seed, self._seed_ready = seed, None
