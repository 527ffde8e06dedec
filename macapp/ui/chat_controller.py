"""The chat window's controller: owns the engine and the open conversation (macapp.core.conversation); no widgets.

The conversation model runs turns (send / regenerate / edit) and records them off the GUI thread, the same way as
the command line's; this controller only turns what it reports into signals for the view, one coalesced batch of
events at a time (EventBridge), each batch already recorded:

    turn_started(TurnStart) → reply_under_way() → reply_events(list)… → turn_settled(TurnEnd)

A reply left behind (New Chat, another conversation) is stopped and still recorded when it ends. Each reply's
EventBridge is released after its final batch, so finished replies hold no memory. What reads or edits the history
for the window (listing, opening, delete / undo / rename, the swap of a read-only history) runs on its
HistoryWorker; the result comes back by signal (conversations_listed, conversation_opened, history_edited).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Callable, TypeVar

from PySide6.QtCore import QObject, Signal

from macapp.core.catalog import ModelRef
from macapp.core.conversation import ConversationModel, Turn, starts_reply
from macapp.core.engine import ChatSession, Engine, Job, SessionOptions
from macapp.core.events import Event, Failed, Finished, Loaded, Reply, TerminalEvent, TurnKind
from macapp.core.history import Conversation, Store
from macapp.core.long_context import notice
from macapp.core.prompt_disk import SETTING as DISK_SETTING, DiskStore, setting_bytes
from macapp.core.prompt_disk.shelf import shelves
from macapp.core.recorder import ChatRecorder, TurnOutcome, TurnResult
from macapp.core.sampling import SamplingParams, preset
from macapp.core.settings import Settings
from macapp.core.vision.images import PreparedImage
from macapp.ui.tools import WindowTools
from macapp.ui.bridge import EventBridge
from macapp.ui.chat_history import ChatHistory, HistoryStatus, HistoryWorker, Switched, conversation_rows
from macapp.ui.settings import int_setting, sampling_for, text_setting

log = logging.getLogger(__name__)
T = TypeVar("T")
VERBS = {TurnKind.SEND: "send", TurnKind.REGENERATE: "regenerate", TurnKind.EDIT: "edit"}


@dataclass(frozen=True)
class TurnStart:
    kind: TurnKind
    text: str  # the user's message (send, edit); "" for a regenerate
    thinking: bool
    images: tuple[PreparedImage, ...] = ()  # pictures sent with the message


@dataclass(frozen=True)
class TurnEnd:
    outcome: TurnOutcome
    reply: Reply | None  # the engine's reply (stats, finish reason, budget) when it kept one
    context_limit: int | None


class EditKind(enum.Enum):
    DELETE = "delete"
    RESTORE = "restore"
    RENAME = "rename"


@dataclass(frozen=True)
class HistoryEdit:
    """A delete, restore or rename of a conversation, done on the history's worker thread."""

    kind: EditKind
    conversation_id: int  # a restore's: the id it came back under
    title: str
    snapshot: Conversation | None = None  # a delete's: what restore_conversation puts back
    error: str | None = None  # why it was not done (a read-only history)


@dataclass(eq=False)
class _Flight:
    """A turn the engine is running (recorded by the conversation model), and the bridge that brings its events here."""

    start: TurnStart
    turn: Turn
    bridge: EventBridge | None = None
    under_way: bool = False  # reply_under_way was said
    seen: bool = False  # a batch came: the turn's start is in the history (a new chat is listed from then)


class ChatController(QObject):
    repaint_interval_ms = 33  # at most ~30 batches a second while streaming (bench/ui_bench.py tries 0)

    model_changed = Signal(str)  # status-bar text: "Loading …", "Loaded …", "No model loaded"
    model_loaded = Signal(object)  # the engine's Loaded event
    model_ready = Signal()
    turn_started = Signal(object)  # TurnStart
    reply_under_way = Signal()  # the new reply began: a regenerated / edited turn is replaced now
    reply_events = Signal(list)  # a coalesced batch of the reply in flight's events
    turn_settled = Signal(object)  # TurnEnd
    turn_left = Signal()  # the reply in flight was stopped and left (unload, New Chat, another conversation)
    conversation_updated = Signal(object)  # a left reply of the open conversation was recorded: its Conversation
    conversations_changed = Signal()
    conversations_listed = Signal(list)  # [(conversation id, title)] for the sidebar, read off the GUI thread (newest ask only)
    conversation_opened = Signal(object)  # the saved Conversation now open, read off the GUI thread
    give_back = Signal(str)  # a message taken for a turn that could not start after all: back in the input box
    history_edited = Signal(object)  # a HistoryEdit, once done off the GUI thread
    history_notice = Signal(str)  # the history cannot be written: chats are not saved (said once)
    status_text = Signal(str)  # a line for the meter
    error = Signal(str)  # something went wrong: one clear sentence
    state_changed = Signal()  # busy / loading / loaded changed

    def __init__(self, settings: Settings, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.history = ChatHistory()
        self.history_worker = HistoryWorker(self)  # the window's reads and edits of the history, off the GUI thread
        self.engine: Engine | None = None  # created on the first load (its worker thread imports MLX, not us)
        self.prompt_disk: DiskStore | None = None  # prompt checkpoints on disk, the chat's and the server's (with the engine)
        self.tools = WindowTools(self)  # the MCP servers, started at the first turn, stopped at shutdown
        self.conversation = self._new_conversation()  # the open one: its session and recorder
        self.model_ref: ModelRef | None = None
        self.model_info: Loaded | None = None
        self.load_job: Job | None = None
        self.loading_name = ""
        self.flight: _Flight | None = None  # the turn in flight, shown
        self.starting = False  # a turn waits for the read-only history's swap (on the worker) before it starts
        self.opening: int | None = None  # the conversation being read to be opened, until it is (or another is asked)
        self.sampling_overrides: dict[str, object] = {}  # on top of the settings (benchmarks, devtools)
        self._left: list[_Flight] = []  # turns left behind (New Chat), recorded until they end
        self._told_unsaved = False
        self._listings = 0  # listings asked: only the newest one's rows are shown
        self._opens = 0  # opens asked (and new chats): only the newest is made the open conversation
        self._turns = 0  # turns started: a re-read asked before the newest turn began is not shown

    # -- state ----------------------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.flight is not None or self.starting

    @property
    def job(self) -> Job | None:
        """The engine's Job of the turn in flight, or None."""
        return self.flight.turn.job if self.flight is not None else None

    @property
    def session(self) -> ChatSession | None:
        """The open conversation's engine session; None until the next turn makes one (from the history)."""
        return self.conversation.session

    @session.setter
    def session(self, session: ChatSession | None) -> None:
        self.conversation.session = session

    @property
    def recorder(self) -> ChatRecorder | None:
        """The open conversation's recorder (None for a new chat until its first turn)."""
        return self.conversation.recorder

    @property
    def store(self) -> Store | None:
        """The history store, or None until open_history()."""
        return self.history.store

    @property
    def unsaved(self) -> bool:
        return self.history.unsaved is not None

    @property
    def conversation_id(self) -> int | None:
        return self.conversation.conversation_id

    @property
    def model_label(self) -> str:
        ref = self.model_ref
        return "" if ref is None else (f"{ref.name} · {ref.bits}-bit" if ref.bits else ref.name)

    def context_limit(self) -> int | None:
        session = self.session
        if session is not None and session.options.context_limit:
            return session.options.context_limit
        return self.model_info.max_context if self.model_info is not None else None

    # -- history --------------------------------------------------------------------------------------------------
    def open_history(self) -> HistoryStatus:
        """Open the history (once); says if chats are not being saved."""
        status = self.history.open()
        if status.unsaved:
            self._tell_unsaved(status.unsaved)
        return status

    def _on_worker(self, work: Callable[[Store], T], done: Callable[[T | None, Exception | None], None]) -> None:
        """Run `work(store)` on the history's worker, `done` back on the GUI thread. The store is the one open when
        the work runs (a read-only one asked for earlier may have been swapped for a scratch one by then)."""
        self.open_history()
        history = self.history

        def run() -> T:
            if history.store is None:
                raise RuntimeError("the chat history is not open")
            return work(history.store)

        self.history_worker.run(run, done)

    def list_conversations(self) -> None:
        """Read the sidebar's rows on the history's worker; `conversations_listed` brings them (an older ask's are dropped)."""
        self._listings += 1
        asked = self._listings

        def done(rows: list[tuple[int, str]] | None, error: Exception | None) -> None:
            if error is not None:
                log.warning("Could not list the conversations: %s", error)
            elif rows is not None and asked == self._listings:
                self.conversations_listed.emit(rows)

        self._on_worker(conversation_rows, done)

    def delete_conversation(self, conversation_id: int, title: str) -> None:
        """Delete it on the history's worker; `history_edited` brings the snapshot that restore_conversation takes."""

        def done(snapshot: Conversation | None, error: Exception | None) -> None:
            name = snapshot.display_title if snapshot is not None else title
            self.history_edited.emit(HistoryEdit(EditKind.DELETE, conversation_id, name, snapshot, None if error is None else str(error)))

        self._on_worker(lambda store: store.delete(conversation_id), done)

    def restore_conversation(self, snapshot: Conversation) -> None:
        """Put a deleted conversation back, on the history's worker; `history_edited` says under which id."""

        def done(key: int | None, error: Exception | None) -> None:
            self.history_edited.emit(
                HistoryEdit(EditKind.RESTORE, key if key is not None else snapshot.id, snapshot.display_title, None, None if error is None else str(error))
            )

        self._on_worker(lambda store: store.restore(snapshot), done)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        def done(_result: None, error: Exception | None) -> None:
            self.history_edited.emit(HistoryEdit(EditKind.RENAME, conversation_id, title, None, None if error is None else str(error)))

        self._on_worker(lambda store: store.rename(conversation_id, title), done)

    def _tell_unsaved(self, text: str) -> None:
        if not self._told_unsaved:
            self._told_unsaved = True
            self.history_notice.emit(text)

    def _ensure_recorder(self, ref: ModelRef) -> ChatRecorder:
        conversation, store = self.conversation, self.store
        if conversation.recorder is None:
            if store is None:
                raise RuntimeError("the chat history is not open")
            conversation.recorder = ChatRecorder(store, model=ref.name, system_prompt=self._system_prompt())
        conversation.recorder.model = ref.name  # the reply records the model that wrote it
        return conversation.recorder

    def _system_prompt(self) -> str | None:
        return text_setting(self.settings, "chat.system_prompt") or None

    def _new_conversation(self, recorder: ChatRecorder | None = None, saved: Conversation | None = None) -> ConversationModel:
        return ConversationModel(self._new_session, recorder, system_prompt=self._system_prompt(), saved=saved, strict=True, run_turn=self.tools.run_turn)

    # -- model ----------------------------------------------------------------------------------------------------
    def _ensure_engine(self) -> Engine:
        if self.engine is None:
            self.engine = Engine()
            # a reopened conversation, after a restart too, reads only what is new (Settings: "Prompt cache on disk")
            self.prompt_disk = DiskStore.open(setting_bytes(self.settings.get(DISK_SETTING)))
            if self.prompt_disk.max_bytes:
                self.engine.position_shelf = shelves(self.prompt_disk)
        return self.engine

    def load_model(self, ref: ModelRef) -> None:
        """Load a ModelRef (with local_path) on the engine's worker thread; the window stays responsive."""
        if self.busy:
            self.stop()
        engine = self._ensure_engine()
        self.model_ref = None
        self.session = None
        self.model_changed.emit(f"Loading {ref.name}…")
        # The context chosen in the library: past the model's native length it loads in long-context mode (YaRN).
        self.load_job = engine.load(str(ref.local_path), context=self.load_context(ref))
        self.loading_name = ref.name
        self.state_changed.emit()
        bridge = EventBridge(parent=self)
        bridge.delivered.connect(lambda batch, r=ref: self._on_load_events(r, batch))
        bridge.attach(self.load_job)

    def load_context(self, ref: ModelRef) -> int | None:
        """The context to load `ref` for: the library's choice, at most the model's longest (None: not chosen)."""
        chosen = int_setting(self.settings, "library.context", 0)
        if chosen <= 0:
            return None
        longest = ref.arch.max_position_embeddings
        return min(chosen, longest) if longest else chosen

    def long_context_notice(self) -> str | None:
        """The loaded model's long-context sentence (the CLI's), None when it runs at its native length."""
        factor = self.model_info.yarn_factor if self.model_info is not None else None
        return notice(factor) if factor else None

    def _on_load_events(self, ref: ModelRef, batch: list[Event]) -> None:
        match batch[-1]:
            case Loaded() as loaded:
                self.model_ref, self.model_info = ref, loaded
                self.load_job = None
                self.session = None
                yarn = f" · YaRN ×{loaded.yarn_factor:g}" if loaded.yarn_factor else ""
                self.model_changed.emit(f"Loaded {self.model_label}{yarn}")
                self.model_loaded.emit(loaded)
                self.state_changed.emit()
                said = self.long_context_notice()
                if said:
                    self.status_text.emit(said[0].upper() + said[1:])
                if ref.load.anyway:
                    self.status_text.emit("Loaded anyway: it may not fit the GPU budget — macOS may swap; replies can be slow or fail")
                self.model_ready.emit()
            case Failed(message=message):
                self.load_job = None
                self.model_changed.emit("No model loaded")
                self.error.emit(f"Could not load {ref.name}: {message}")
                self.state_changed.emit()

    def unload_model(self) -> None:
        """Free the model's memory (the conversation stays; loading a model again continues it)."""
        if self.engine is None or self.model_ref is None:
            return
        self._leave_turn()
        job = self.engine.unload()
        self.model_ref = self.model_info = None
        self.session = None
        self.model_changed.emit("No model loaded")
        self.state_changed.emit()
        bridge = EventBridge(parent=self)
        bridge.delivered.connect(lambda _batch: self.status_text.emit("Model unloaded: its memory is free again"))
        bridge.attach(job)

    # -- conversation ---------------------------------------------------------------------------------------------
    def new_chat(self) -> None:
        self._leave_turn()
        self._opens += 1  # a conversation still being read is not opened after all
        self.opening = None
        self.conversation = self._new_conversation()
        self.conversations_changed.emit()
        self.state_changed.emit()

    def open_conversation(self, conversation_id: int) -> None:
        """Open a saved conversation: read on the history's worker, then `conversation_opened` brings it (not if
        another conversation or a new chat was asked for meanwhile); the next turn re-reads it once into a fresh
        engine session. No turn starts while it is being read."""
        self._leave_turn()
        self._opens += 1
        asked, self.opening = self._opens, conversation_id

        def read(store: Store) -> tuple[Store, Conversation]:
            return store, store.get_conversation(conversation_id)

        def done(read: tuple[Store, Conversation] | None, error: Exception | None) -> None:
            if asked != self._opens:
                return
            self.opening = None
            if read is None:  # e.g. deleted meanwhile
                self.error.emit(f"Could not open the conversation: {error}")
                self.state_changed.emit()
                return
            store, conv = read
            recorder = ChatRecorder(store, conv.id, model=conv.model, system_prompt=conv.system_prompt, settings=conv.settings)
            self.conversation = self._new_conversation(recorder, saved=conv)  # read for its next session off this thread
            self.conversations_changed.emit()
            self.state_changed.emit()
            self.conversation_opened.emit(conv)

        self.state_changed.emit()
        self._on_worker(read, done)

    def _new_session(self, system: str | None, messages: list[dict[str, object]] | None) -> ChatSession:
        """An engine session for the open conversation (the conversation model asks when its next turn needs one)."""
        # The context and KV-cache bits chosen in the library are the ones the fit was computed for.
        limit = int_setting(self.settings, "library.context", 0) or None
        if limit and self.model_info is not None:
            limit = min(limit, self.model_info.max_context)
        ref = self.model_ref
        kv_bits = self.settings.get("library.kv_bits")
        options = SessionOptions(
            context_limit=limit,
            kv_bits=kv_bits if isinstance(kv_bits, int) else None,  # None: not chosen (or not a number: a hand-edited file)
            memory_budget_bytes=ref.load.memory_budget_bytes if ref is not None else None,  # set by "Load anyway"
        )
        return self._ensure_engine().new_session(system_prompt=system, messages=messages, options=options)

    # -- turns ----------------------------------------------------------------------------------------------------
    def sampling(self, thinking: bool) -> tuple[SamplingParams, int | None]:
        """(SamplingParams, thinking budget) from the settings; ValueError when they cannot be used."""
        values = sampling_for(self.settings, thinking)
        thinking_budget = values.pop("thinking_budget", None)
        budget = int(thinking_budget) if thinking_budget is not None else None
        params = preset(thinking).with_overrides(**{**values, **self.sampling_overrides})
        params.validate()
        return params, budget

    def send(self, text: str, thinking: bool, images: tuple[PreparedImage, ...] = ()) -> bool:
        return self.run_turn(TurnKind.SEND, text, thinking, images)

    def regenerate(self, thinking: bool) -> bool:
        return self.run_turn(TurnKind.REGENERATE, "", thinking)

    def edit(self, text: str, thinking: bool) -> bool:
        return self.run_turn(TurnKind.EDIT, text, thinking)

    def run_turn(self, kind: TurnKind, text: str, thinking: bool, images: tuple[PreparedImage, ...] = ()) -> bool:
        """Start a turn (`images`: a send's pictures); False (with `error` emitted when there is something to say)
        when it could not start. Bad settings are refused before anything is saved. On a read-only history the
        turn starts once the history's worker has swapped it for a scratch one; if it cannot start then, `error`
        says why and `give_back` returns the text."""
        ref = self.model_ref
        if self.busy or self.opening is not None or ref is None or (kind is not TurnKind.REGENERATE and not text.strip()):
            return False
        try:
            sampling, budget = self.sampling(thinking)
        except ValueError as exc:
            self.error.emit(f"The chat settings cannot be used: {exc}. Fix them in Settings…, then send again.")
            return False
        try:
            self.open_history()
        except Exception as exc:  # noqa: BLE001 - never raised into Qt's event loop; what was typed is kept
            self.error.emit(f"Could not {VERBS[kind]}: {exc}")
            return False

        def begin() -> bool:
            return self._begin(ref, TurnStart(kind, text, thinking, images), sampling, budget)

        if self.history.read_only:
            self._make_writable_then(begin, ref, kind, text)
            return True
        return begin()

    def _begin(self, ref: ModelRef, start: TurnStart, sampling: SamplingParams, budget: int | None) -> bool:
        try:
            self.conversation.system_prompt = self._system_prompt()  # a new chat's, when its session is made
            self._ensure_recorder(ref)
            turn = self.conversation.start(start.kind, start.text, thinking=start.thinking, images=start.images, sampling=sampling, thinking_budget=budget)
        except Exception as exc:  # noqa: BLE001 - never raised into Qt's event loop; what was typed is kept
            self.error.emit(f"Could not {VERBS[start.kind]}: {exc}")
            self.state_changed.emit()
            return False
        self._start(_Flight(TurnStart(start.kind, start.text, start.thinking, turn.images), turn))
        return True

    def _make_writable_then(self, begin: Callable[[], bool], ref: ModelRef, kind: TurnKind, text: str) -> None:
        """Swap the read-only history for a scratch one (the open conversation copied) on the history's worker,
        then start the turn; if the conversation or the model changed meanwhile (or another conversation or a new
        chat was asked for: it is being read), the text is given back."""
        conversation, conversation_id, history = self.conversation, self.conversation_id, self.history
        opens = self._opens
        self.starting = True
        self.state_changed.emit()

        def work() -> tuple[Switched | None, ChatRecorder | None]:
            switched = history.make_writable(conversation_id)
            if switched is None or switched.conversation_id is None or history.store is None:
                return switched, None
            return switched, ChatRecorder.resume(history.store, switched.conversation_id)

        def done(result: tuple[Switched | None, ChatRecorder | None] | None, error: Exception | None) -> None:
            self.starting = False
            switched, recorder = result if result is not None else (None, None)
            if switched is not None:
                if conversation is self.conversation:
                    conversation.recorder = recorder
                self._tell_unsaved(switched.reason)
            if error is not None:
                self.error.emit(f"Could not {VERBS[kind]}: {error}")
            elif conversation is self.conversation and self._opens == opens and self.model_ref is ref and begin():
                return
            self.give_back.emit(text)
            self.state_changed.emit()

        self.history_worker.run(work, done)

    def _start(self, flight: _Flight) -> None:
        self.flight = flight
        self._turns += 1
        self.turn_started.emit(flight.start)
        self.status_text.emit("Starting…")
        self.state_changed.emit()
        self.conversations_changed.emit()
        bridge = EventBridge(interval_ms=self.repaint_interval_ms, parent=self)
        bridge.delivered.connect(lambda batch, f=flight: self._on_events(f, batch))
        flight.bridge = bridge
        bridge.attach(flight.turn)  # past events (a quick refusal) are delivered right here

    def _on_events(self, flight: _Flight, batch: list[Event]) -> None:
        """A batch of the turn's events, each already recorded (on the conversation's recording thread)."""
        last = batch[-1]
        ended = isinstance(last, TerminalEvent)
        if flight is not self.flight:  # left behind: recorded, not shown
            if ended:
                self._release(flight)
                if flight.turn.conversation is self.conversation and self.flight is None and self.conversation_id is not None:
                    self._tell_updated(self.conversation, self.conversation_id)
                self.conversations_changed.emit()
            return
        if not flight.seen:
            flight.seen = True
            self.conversations_changed.emit()
        if not flight.under_way and any(starts_reply(event) for event in batch):
            flight.under_way = True
            self.reply_under_way.emit()
        self.reply_events.emit(batch)
        if isinstance(last, TerminalEvent):
            self._settle(flight, last)

    def _tell_updated(self, conversation: ConversationModel, conversation_id: int) -> None:
        """conversation_updated with the history's copy, read on the worker; dropped if another one was opened, or
        if a turn started after it was asked (its copy would be older than what that turn shows)."""
        turns = self._turns

        def done(saved: Conversation | None, error: Exception | None) -> None:  # an error: it was deleted meanwhile
            if saved is not None and conversation is self.conversation and self.flight is None and turns == self._turns:
                self.conversation_updated.emit(saved)

        self._on_worker(lambda store: store.get_conversation(conversation_id), done)

    def _settle(self, flight: _Flight, terminal: TerminalEvent) -> None:
        turn = flight.turn
        outcome = turn.outcome or TurnOutcome(turn.kind, TurnResult.UNDONE, turn.text)
        self.flight = None
        self._release(flight)
        recorder = self.recorder
        if turn.record_error is not None:  # its start could not be saved: the model stopped it
            self.error.emit(f"Could not {VERBS[turn.kind]}: {turn.record_error}")
        elif recorder is not None and recorder.error is not None:
            self.error.emit(f"The reply could not be saved: {recorder.error}")
            recorder.error = None
        elif outcome.error is not None:
            self.error.emit(outcome.error)
        reply = terminal.reply if isinstance(terminal, Finished) and terminal.reply.kept else None
        self.turn_settled.emit(TurnEnd(outcome, reply, self.context_limit()))
        self.state_changed.emit()
        self.conversations_changed.emit()

    def _release(self, flight: _Flight) -> None:
        """The bridge deletes itself after its final batch; drop every reference to the finished turn."""
        flight.bridge = None
        if flight in self._left:
            self._left.remove(flight)

    def stop(self) -> None:
        if self.flight is not None:
            self.flight.turn.stop()

    def _leave_turn(self) -> None:
        """Leave the reply in flight (New Chat, another conversation): stop it; it is recorded when it ends."""
        flight, self.flight = self.flight, None
        if flight is None:
            return
        self._left.append(flight)
        flight.turn.stop()
        self.turn_left.emit()
        self.state_changed.emit()

    def shutdown(self) -> None:
        """Stop what runs, record what it wrote, close the engine and the history."""
        self._leave_turn()
        for flight in list(self._left):
            try:
                flight.turn.wait(5)  # recorded to its end, off this thread
            except TimeoutError:
                pass
            if flight.bridge is not None:
                flight.bridge.flush()  # its last batch shown now, while the history is open, not after
            flight.turn.abandon()  # no-op once it settled
        if self.engine is not None:
            self.engine.close()
        if self.prompt_disk is not None:
            self.prompt_disk.close()  # the checkpoints queued for writing go to disk first
        self.tools.close()
        self.history_worker.close()
        self.history.close()
