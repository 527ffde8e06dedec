"""The inference engine: one long-lived worker thread owns MLX, the model and every chat cache.

Public API (everything returns at once; work happens on the worker, in submission order):

    engine = Engine()                                   # the worker starts on first use
    job = engine.load("path/or/org/repo")               # -> Job ending in Loaded | Failed
    session = engine.new_session(system_prompt=None, messages=None, options=SessionOptions())
    job = session.send(text, thinking=True, sampling=None, thinking_budget=None)
    job = session.regenerate(thinking=None, sampling=None, thinking_budget=None)   # redo the last reply
    job = session.edit_last(text, thinking=None, sampling=None, thinking_budget=None)  # replace the last user message
    for event in job.events(): ...                      # blocking iterator (events.py), ends after Finished/Failed
    job.add_listener(callback)                          # every event once, in order (past ones replayed at once);
                                                        # called on the worker thread, or on whichever thread is
                                                        # already delivering to it (see Job.add_listener)
    job.stop()                                          # honoured within one token; at once while reading
    job.result(timeout=None)                            # the Reply / Loaded, or raises EngineError
    job.join(timeout=None)                              # wait until the worker is done with the job
    engine.unload(); engine.close()

Design:
- One worker thread per process (shared by Engine objects) does all MLX work; it never ends, because with
  mlx 0.32 a process whose MLX thread has exited can abort at exit.
- Generation is mlx-lm's own `stream_generate`, with nothing added per token but a list append, the
  thinking splitter's string work and an event append; so decode speed is mlx-lm's.
- Each session keeps ONE prompt cache and appends only the new turn: the previous reply is closed with
  ``<|im_end|>\\n`` (or just ``\\n`` when the model wrote it) and only the new user message is templated,
  with an explicit ``enable_thinking`` every turn. Qwen3.5's DeltaNet cache cannot be trimmed, so the trade
  is knowing: within a session earlier replies keep their reasoning in the context (cheap, never re-read);
  a session opened from saved `messages` is read once through the real template (which drops old
  reasoning), then appended to.
- Regenerate and edit do not re-read the conversation: before each turn the engine snapshots the cache
  (KV layers: their length, since they only grow; DeltaNet layers: references to their immutable state
  arrays), and again just before the prompt's last token. Regenerate restores the second and prefills one
  token (or the user turn when the thinking mode changes); edit restores the first and prefills the new
  user turn. A snapshot costs no copy; it keeps the DeltaNet states alive (`ChatSession.snapshot_bytes`).
- The thinking budget closes the reasoning after N reasoning tokens by feeding ``</think>\\n\\n`` to the
  model and letting it answer.
- Stop: checked on every token. A reply stopped while generating is kept (finish_reason "stopped") and
  the next turn closes it. Stopped while its prompt is still being read, a send or edit is undone
  (Reply.kept False: the conversation is as before it): `Job.stop()` has that Finished emitted at once
  (from a helper thread, never inside the caller's stop()) and the worker undoes the turn when the
  prefill chunk in flight ends, before any later job runs (`Job.join()` waits for that). A regenerate
  from a snapshot re-reads one short turn and stops at its first token instead, so its user message is
  never lost.
- Bad input fails before any work, with a code from events.py: missing folder, not a Qwen3.5 model,
  corrupt files, no model loaded, empty prompt, prompt over the context limit or the memory budget.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from macapp.core import events as ev
from macapp.core.catalog import REPO_ID, SUPPORTED_MODEL_TYPES
from macapp.core.events import (
    AnswerDelta,
    Failed,
    Finished,
    GenerationStats,
    Loaded,
    PromptProgress,
    ReasoningDelta,
    Reply,
    StatsUpdate,
    Unloaded,
)
from macapp.core.sampling import SamplingParams, make_sampler_and_processors, preset
from macapp.core.sizing import DEFAULT_PREFILL_STEP
from macapp.core.thinking import ANSWER, ThinkingSplitter

STATS_INTERVAL_S = 0.25
NOTIFY_INTERVAL_S = 0.02  # a blocked events() reader sees text deltas within this (Job.emit)
_DELTA_TYPES = (AnswerDelta, ReasoningDelta)


class EngineError(Exception):
    """A failure with a code from events.py and a message for people."""

    def __init__(self, message: str, code: str = ev.ERROR):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class SessionOptions:
    context_limit: int | None = None  # tokens; None: the model's max_position_embeddings
    kv_bits: int | None = None  # 4 or 8 quantizes the full-attention layers' KV cache
    kv_group_size: int = 64
    quantized_kv_start: int = 0  # with kv_bits, quantize from this many cached tokens on
    prefill_step_size: int = DEFAULT_PREFILL_STEP
    memory_budget_bytes: int | None = None  # None: this machine's GPU budget (macapp.core.hardware)


# ------------------------------------------------------------------------------------------------ jobs


class _Listener:
    """One listener's queue of undelivered events; whichever thread holds `busy` delivers them, in order."""

    def __init__(self, callback: Callable[[Any], None]):
        self.callback = callback
        self.pending: collections.deque[Any] = collections.deque()  # filled under the job's lock
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
                    except Exception:  # a listener's bug must not kill the worker
                        pass
            finally:
                self.busy.release()


class Job:
    """A unit of work on the worker thread and the stream of events it reports."""

    _ids = itertools.count(1)

    def __init__(self, kind: str):
        self.id = next(self._ids)
        self.kind = kind
        self._events: list[Any] = []
        self._cond = threading.Condition()
        self._listeners: list[_Listener] = []
        self._stop = threading.Event()
        self._done = False
        self._waiting = 0  # readers blocked in events()
        self._last_notify = 0.0
        self._stop_reply: Any = None  # while a prompt is read: the terminal event stop() may emit at once
        self._settled = threading.Event()  # the worker is done with this job (see join())
        self.stop_requested_at: float | None = None

    # producer side (worker thread)
    def emit(self, event: Any) -> None:
        with self._cond:
            if self._done:  # nothing after the terminal event (stop() may have sent it early)
                return
            self._events.append(event)
            if isinstance(event, ev.TERMINAL_EVENTS):
                self._done = True
                self._cond.notify_all()
            elif self._waiting:
                # Wake a blocked events() reader at most every NOTIFY_INTERVAL_S for text deltas: a thread
                # switch per token costs generation time; the reader also polls at that interval.
                now = time.perf_counter()
                if now - self._last_notify >= NOTIFY_INTERVAL_S or type(event) not in _DELTA_TYPES:
                    self._last_notify = now
                    self._cond.notify_all()
            listeners = self._listeners
            for listener in listeners:  # queued under the lock: each listener's order is the job's order
                listener.pending.append(event)
        for listener in listeners:
            listener.deliver()

    # consumer side (any thread)
    def add_listener(self, callback: Callable[[Any], None]) -> None:
        """Call `callback(event)` for every event of the job, each once and in order, the terminal one last.

        Past events are delivered now, on this thread; new ones on the thread that emits them (the worker),
        except that events arriving while this thread is still delivering are delivered by it, after the
        ones before them. A callback must not wait for the job: it may run on the worker."""
        listener = _Listener(callback)
        with self._cond:
            listener.pending.extend(self._events)
            self._listeners = [*self._listeners, listener]
        listener.deliver()

    def events(self, timeout: float | None = None) -> Iterator[Any]:
        """Every event of this job, blocking until the terminal one (TimeoutError after `timeout` idle seconds)."""
        i = 0
        while True:
            with self._cond:
                waited = 0.0
                while i >= len(self._events):
                    if self._done:
                        return
                    if timeout is not None and waited >= timeout:
                        raise TimeoutError(f"no event from the engine in {timeout} s")
                    self._waiting += 1
                    try:
                        self._cond.wait(NOTIFY_INTERVAL_S)
                    finally:
                        self._waiting -= 1
                    waited += NOTIFY_INTERVAL_S
                batch = self._events[i:]
            i += len(batch)
            yield from batch

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the job ends; return its terminal event."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._done, timeout):
                raise TimeoutError(f"the engine did not finish in {timeout} s")
            return self._events[-1]

    def join(self, timeout: float | None = None) -> None:
        """Block until the worker is done with this job (after a stop while reading, Finished comes first)."""
        if not self._settled.wait(timeout):
            raise TimeoutError(f"the engine did not finish in {timeout} s")

    def result(self, timeout: float | None = None) -> Any:
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
            early, self._stop_reply = self._stop_reply, None
        if early is not None:  # from a helper thread, so no listener runs inside the caller's stop()
            threading.Thread(target=self.emit, args=(early,), name="qwen-desk-stop", daemon=True).start()

    def _arm_stop_reply(self, event: Any) -> bool:
        """Worker: let stop() answer with `event` at once (None disarms). True if it already did."""
        with self._cond:
            self._stop_reply = event
            return self._done

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def done(self) -> bool:
        return self._done

    @property
    def history(self) -> list[Any]:
        with self._cond:
            return list(self._events)


# ------------------------------------------------------------------------------------------------ model


@dataclass
class LoadedModel:
    """The loaded model as the worker holds it; read it only from work running on the worker (Engine.submit)."""

    model: Any
    tokenizer: Any
    config: dict
    path: Path
    info: Loaded
    arch: Any  # macapp.core.catalog.Arch or None
    im_end_id: int | None
    think_end_id: int | None
    weights_bytes: int


def locate_model(spec: str) -> Path:
    """A local folder, or the downloaded snapshot of a hub repo id or catalog name; EngineError otherwise."""
    spec = (spec or "").strip()
    if not spec:
        raise EngineError("No model given: pass a model folder or a downloaded repo id.", ev.NOT_FOUND)
    folder = Path(spec).expanduser()
    if folder.is_dir():
        return folder.resolve()
    if folder.exists():
        raise EngineError(f"{spec} is a file, not a model folder.", ev.NOT_A_MODEL)
    looks_like_path = spec.startswith((".", "~", os.sep)) or spec.count("/") > 1 or (os.sep != "/" and os.sep in spec)
    if looks_like_path:
        raise EngineError(f"No model folder at {spec}.", ev.NOT_FOUND)
    repo = spec
    if not REPO_ID.match(spec):
        try:
            from macapp.core.catalog import resolve_model

            ref = resolve_model(spec)
        except Exception as exc:
            raise EngineError(f"No model folder at {spec}, and it is not a known model name ({exc}).", ev.NOT_FOUND) from exc
        if ref.local_path is not None:
            return Path(ref.local_path)
        repo = ref.repo or spec
    try:
        from huggingface_hub import snapshot_download

        from macapp.core.download.hfcache import hub_cache_dir  # HF_HOME / HF_HUB_CACHE read now, not at import

        return Path(snapshot_download(repo, local_files_only=True, cache_dir=str(hub_cache_dir())))
    except Exception as exc:
        raise EngineError(
            f"{repo} is not downloaded yet: run `qwen-desk download {repo}` first (or pass a model folder).",
            ev.NOT_FOUND,
        ) from exc


def safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file cannot be whole (truncated, bad header), or None; reads only its header."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return "too short"
            n = int.from_bytes(head, "little")
            if n <= 0 or 8 + n > size:
                return "bad header length"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as exc:
        return f"unreadable header: {exc}"
    if not isinstance(header, dict):
        return "bad header"
    end = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(meta["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            return f"bad entry for {name}"
    if 8 + n + end > size:
        return f"truncated: {size:,} bytes of {8 + n + end:,}"
    return None


def check_model_folder(path: Path) -> dict:
    """The folder's config.json if it looks like a Qwen3.5-family MLX model; EngineError with the reason otherwise."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise EngineError(f"{path} is not a model folder: it has no config.json.", ev.NOT_A_MODEL)
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise EngineError(f"{config_file} is damaged ({exc}); download the model again.", ev.CORRUPT) from exc
    if not isinstance(config, dict):
        raise EngineError(f"{config_file} is damaged (not a JSON object); download the model again.", ev.CORRUPT)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    model_type = config.get("model_type") or text.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise EngineError(
            f"{path.name} is not a Qwen3.5-family model (model_type {model_type!r}); Qwen Desk runs qwen3_5 and qwen3_5_moe models.",
            ev.NOT_A_MODEL,
        )
    weight_files = sorted(path.glob("model*.safetensors"))
    if not weight_files:
        raise EngineError(f"{path} has no weights (model*.safetensors); download the model again.", ev.CORRUPT)
    for weight_file in weight_files:
        problem = safetensors_problem(weight_file)
        if problem:
            raise EngineError(f"{weight_file.name} in {path} is damaged ({problem}); download the model again.", ev.CORRUPT)
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise EngineError(f"{path} has no tokenizer files; download the model again.", ev.CORRUPT)
    return config


def _load_model(path: Path, config: dict) -> LoadedModel:
    """Read a model folder already found by locate_model and checked by check_model_folder (its config)."""
    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten

    mx.clear_cache()
    before = mx.get_active_memory()
    start = time.perf_counter()
    try:
        model, tokenizer, loaded_config = mlx_lm.load(str(path), return_config=True)
    except Exception as exc:
        raise EngineError(f"Could not read the model in {path}: {exc}. The files may be damaged; download it again.", ev.CORRUPT) from exc
    load_time = time.perf_counter() - start
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    quant = loaded_config.get("quantization") or {}
    try:
        from macapp.core.catalog import Arch

        arch = Arch.from_config(config)
    except Exception:
        arch = None
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    name = path.name
    if path.parent.name == "snapshots":  # a Hugging Face cache snapshot: name it by its repo id
        name = path.parent.parent.name.removeprefix("models--").replace("--", "/")
    info = Loaded(
        path=str(path),
        name=name,
        model_type=str(config.get("model_type")),
        load_time_s=load_time,
        memory_bytes=int(mx.get_active_memory() - before),
        weights_bytes=int(weights),
        bits=quant.get("bits"),
        max_context=int(text.get("max_position_embeddings") or 262144),
        has_thinking=bool(tokenizer.has_thinking),
    )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        path=path,
        info=info,
        arch=arch,
        im_end_id=vocab.get("<|im_end|>"),
        think_end_id=vocab.get("</think>"),
        weights_bytes=int(weights),
    )


# ------------------------------------------------------------------------------------------------ cache snapshots


@dataclass
class CacheSnapshot:
    """A point in a session's cache to come back to, without copying: see the module docstring."""

    length: int  # tokens in the cache at that point
    layers: list[tuple[str, Any]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for kind, v in self.layers if kind == "arrays" for a in v if a is not None)


def take_snapshot(cache: list, length: int) -> CacheSnapshot:
    layers: list[tuple[str, Any]] = []
    for c in cache:
        if hasattr(c, "offset") and hasattr(c, "trim"):
            layers.append(("kv", int(c.offset)))
        elif hasattr(c, "cache"):
            layers.append(("arrays", list(c.cache)))
        else:  # pragma: no cover - a cache type this architecture does not use
            raise TypeError(f"cannot snapshot a {type(c).__name__}")
    return CacheSnapshot(length, layers)


def restore_snapshot(cache: list, snap: CacheSnapshot) -> None:
    for c, (kind, value) in zip(cache, snap.layers):
        if kind == "kv":
            c.trim(c.offset - value)  # KV layers only ever grew past the snapshot: forget the tail
        else:
            c.cache = list(value)  # DeltaNet state arrays are replaced, never written in place
            c.lengths = None
            c.left_padding = None


# ------------------------------------------------------------------------------------------------ engine


class _Worker:
    """The process's one MLX thread. It never ends: with mlx 0.32 (CPU) a process whose MLX-using thread has
    exited can abort at interpreter exit ("terminate called without an active exception"), so closed
    engines leave it parked on its queue instead."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="qwen-desk-engine", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job, work = self.queue.get()
            try:
                work(job)
            except EngineError as exc:
                job.emit(Failed(exc.message, exc.code))
            except Exception as exc:  # keep the worker alive whatever happens
                job.emit(Failed(f"Unexpected engine error: {type(exc).__name__}: {exc}", ev.ERROR))
            if not job.done:  # every job ends with a terminal event
                job.emit(Failed("The engine ended this job without a result.", ev.ERROR))
            job._settled.set()


_worker: _Worker | None = None
_worker_lock = threading.Lock()


def worker_thread() -> threading.Thread:
    """The engine's worker thread (started on first use)."""
    return _get_worker().thread


def _get_worker() -> _Worker:
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = _Worker()
        return _worker


class Engine:
    """The loaded model and the jobs on it; all MLX work runs on the one worker thread, in order."""

    def __init__(self) -> None:
        self._model: LoadedModel | None = None
        self._budget: int | None = None
        self._closed = False
        self._sessions: weakref.WeakSet = weakref.WeakSet()
        self._jobs: weakref.WeakSet = weakref.WeakSet()

    def submit(self, kind: str, work: Callable[[Job], None]) -> Job:
        """Run `work(job)` on the worker thread (for engine extensions and tests)."""
        if self._closed:
            raise RuntimeError("this engine is closed")
        job = Job(kind)
        self._jobs.add(job)
        _get_worker().queue.put((job, work))
        return job

    def _forget_caches(self) -> None:
        """Drop every session's cache (worker thread): they belong to the model being replaced."""
        for session in list(self._sessions):
            session._drop_cache()

    def close(self, timeout: float = 30.0) -> None:
        """Stop this engine's jobs, drop the model and caches (the worker thread stays, parked)."""
        if self._closed:
            return
        for job in list(self._jobs):
            if not job.done:
                job.stop()

        def work(job: Job) -> None:
            self._forget_caches()
            self._model = None
            job.emit(Unloaded(memory_bytes=0))

        done = self.submit("close", work)
        self._closed = True
        try:
            done.wait(timeout)
        except TimeoutError:
            pass
        self._model = None

    # -- model -----------------------------------------------------------------------------------------
    def load(self, spec: str | os.PathLike) -> Job:
        """Load a model folder or a downloaded repo; the Loaded event reports load time and memory."""

        def work(job: Job) -> None:
            if job.stopped:
                job.emit(Failed("Loading was cancelled.", ev.CANCELLED))
                return
            path = locate_model(str(spec))
            config = check_model_folder(path)  # refuse bad folders before letting go of the current model
            self._forget_caches()  # free the old model and its caches before reading the new one
            self._model = None
            self._model = _load_model(path, config)
            self.memory_budget_bytes()  # learn the machine now, not on the first message
            job.emit(self._model.info)

        return self.submit("load", work)

    def unload(self) -> Job:
        def work(job: Job) -> None:
            import mlx.core as mx

            self._forget_caches()
            self._model = None
            mx.clear_cache()
            job.emit(Unloaded(memory_bytes=int(mx.get_active_memory())))

        return self.submit("unload", work)

    @property
    def loaded(self) -> Loaded | None:
        model = self._model
        return model.info if model is not None else None

    @property
    def model(self) -> LoadedModel | None:
        """The loaded model itself, for engine extensions (the API server): use it only inside Engine.submit work."""
        return self._model

    def memory_budget_bytes(self) -> int | None:
        """This machine's GPU memory budget (hardware.detect_machine), cached."""
        if self._budget is None:
            try:
                from macapp.core.hardware import detect_machine

                self._budget = int(detect_machine().budget_bytes)
            except Exception:
                return None
        return self._budget

    def new_session(
        self,
        system_prompt: str | None = None,
        messages: list[dict] | None = None,
        options: SessionOptions | None = None,
    ) -> "ChatSession":
        """A conversation; `messages` (role/content[/reasoning] dicts) reopens a saved one."""
        session = ChatSession(self, system_prompt=system_prompt, messages=messages, options=options or SessionOptions())
        self._sessions.add(session)
        return session


# ------------------------------------------------------------------------------------------------ sessions


@dataclass
class _Turn:
    """What the session remembers of its last turn, for regenerate and edit."""

    before_turn: CacheSnapshot  # the cache before this turn's prompt (edit_last goes back here)
    close_before: str  # the previous reply's pending close text at that point
    prefix: list[int] | None  # prompt tokens before the user message (closing text, or system/history)
    before_last: CacheSnapshot  # before the prompt's last token (regenerate goes back here)
    last_token: int
    thinking: bool
    closed_think: bool  # thinking with budget 0: the prompt itself closed the reasoning


@dataclass
class _Plan:
    """How to run one turn: what to restore, what to feed, what the conversation is before it."""

    prompt: list[int]
    user_text: str
    history: list[dict]
    prefix: list[int] | None
    close_before: str
    restore: CacheSnapshot | None = None  # regenerate/edit: go back here first
    turn_start: CacheSnapshot | None = None  # known start of the turn (regenerate); None: snapshot now
    can_roll_back: bool = True  # a stop while reading undoes the turn; a regenerate from a snapshot reads on (one
    # short turn) and stops at its first token, so the user message stays in the cache
    keep_user_on_stop: bool = False  # a stop while re-reading a whole conversation keeps its last user message


class ChatSession:
    """One conversation with one prompt cache, appended to turn by turn. Methods return Jobs."""

    def __init__(self, engine: Engine, system_prompt: str | None, messages: list[dict] | None, options: SessionOptions):
        self.engine = engine
        self.options = options
        self.system_prompt = system_prompt
        initial = [dict(m) for m in (messages or [])]
        if initial and initial[0].get("role") == "system":
            if system_prompt is None:
                self.system_prompt = initial[0].get("content") or None
            initial = initial[1:]
        self._messages: list[dict] = initial
        self._model: LoadedModel | None = None  # the model the cache belongs to
        self._cache: list | None = None
        self.tokens: list[int] = []  # every token in the cache, in order
        self._close_text = ""  # what the next turn feeds first to close the previous reply
        self._turn: _Turn | None = None
        self.last_job: Job | None = None
        self.last_reply: Reply | None = None

    # -- public ----------------------------------------------------------------------------------------
    @property
    def messages(self) -> list[dict]:
        """The conversation: role/content dicts; assistant ones also carry reasoning, thinking and finish_reason."""
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return out + [dict(m) for m in self._messages]

    @property
    def context_tokens(self) -> int:
        """Tokens in this session's cache (0 until the first send of a reopened conversation)."""
        return len(self.tokens)

    @property
    def snapshot_bytes(self) -> int:
        """Memory the regenerate/edit snapshots keep alive (DeltaNet states of two earlier points)."""
        turn = self._turn
        return 0 if turn is None else turn.before_turn.nbytes + turn.before_last.nbytes

    def send(self, text: str, thinking: bool = True, sampling: SamplingParams | None = None, thinking_budget: int | None = None) -> Job:
        """Add a user message and stream the reply. `sampling` None: the model card's preset for the mode."""
        return self._submit(lambda job: self._send(job, text, bool(thinking), sampling, thinking_budget))

    def regenerate(self, thinking: bool | None = None, sampling: SamplingParams | None = None, thinking_budget: int | None = None) -> Job:
        """Replace the last reply with a new one to the same message; `thinking` None keeps the last mode."""
        return self._submit(lambda job: self._redo(job, None, thinking, sampling, thinking_budget))

    def edit_last(self, text: str, thinking: bool | None = None, sampling: SamplingParams | None = None, thinking_budget: int | None = None) -> Job:
        """Replace the last user message (and its reply) with `text`, and answer it."""
        return self._submit(lambda job: self._redo(job, text, thinking, sampling, thinking_budget))

    def reset(self) -> Job:
        """Forget the cache (not the messages): the next send reads the conversation once through the template."""

        def work(job: Job) -> None:
            self._drop_cache()
            job.emit(Finished(Reply(kept=False)))

        return self._submit(work)

    # -- worker side -----------------------------------------------------------------------------------
    def _submit(self, work: Callable[[Job], None]) -> Job:
        job = self.engine.submit("chat", work)
        self.last_job = job
        return job

    def _drop_cache(self) -> None:
        self._cache = None
        self._model = None
        self.tokens = []
        self._close_text = ""
        self._turn = None

    def _require_model(self) -> LoadedModel:
        model = self.engine._model
        if model is None:
            raise EngineError("No model is loaded: load a model first.", ev.NO_MODEL)
        if self._model is not model:  # another model: its cache starts empty and reads the conversation once
            self._drop_cache()
            self._model = model
        return model

    @staticmethod
    def _template(m: LoadedModel, messages: list[dict], thinking: bool) -> list[int]:
        msgs = [{"role": x["role"], "content": x.get("content") or ""} for x in messages]
        return list(m.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, enable_thinking=thinking))

    def _full_parts(self, m: LoadedModel, history: list[dict], text: str, thinking: bool) -> tuple[list[int] | None, list[int]]:
        """(prefix, all tokens) for reading the whole conversation through the template."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        full = self._template(m, system + history + [{"role": "user", "content": text}], thinking)
        user = self._template(m, [{"role": "user", "content": text}], thinking)
        prefix = full[: len(full) - len(user)] if full[len(full) - len(user) :] == user else None
        return prefix, full

    @staticmethod
    def _close_thinking(m: LoadedModel, prompt: list[int], thinking: bool, budget: int | None) -> list[int]:
        if thinking and budget == 0:  # no reasoning at all: the prompt closes it
            return prompt + list(m.tokenizer.encode("</think>\n\n", add_special_tokens=False))
        return prompt

    def _send(self, job: Job, text: str, thinking: bool, sampling: SamplingParams | None, budget: int | None) -> None:
        start = time.perf_counter()
        if job.stopped:
            job.emit(Finished(Reply(thinking=thinking, finish_reason="stopped", kept=False)))
            return
        if not (text or "").strip():
            raise EngineError("The message is empty: type something to send.", ev.EMPTY_PROMPT)
        m = self._require_model()
        if self._cache is None or not self.tokens:
            prefix, prompt = self._full_parts(m, self._messages, text, thinking)
        else:
            prefix = list(m.tokenizer.encode(self._close_text, add_special_tokens=False)) if self._close_text else []
            prompt = prefix + self._template(m, [{"role": "user", "content": text}], thinking)
        plan = _Plan(self._close_thinking(m, prompt, thinking, budget), text, list(self._messages), prefix, self._close_text)
        self._run_turn(job, m, start, plan, thinking, sampling, budget)

    def _redo(self, job: Job, new_text: str | None, thinking: bool | None, sampling: SamplingParams | None, budget: int | None) -> None:
        start = time.perf_counter()
        if job.stopped:
            job.emit(Finished(Reply(finish_reason="stopped", kept=False)))
            return
        if new_text is not None and not new_text.strip():
            raise EngineError("The message is empty: type something to send.", ev.EMPTY_PROMPT)
        users = [i for i, msg in enumerate(self._messages) if msg.get("role") == "user"]
        if not users:
            raise EngineError("There is no message to answer again yet.", ev.NOTHING_TO_REDO)
        last_user = users[-1]
        m = self._require_model()
        tail = self._messages[last_user + 1 :]
        old_mode = tail[0].get("thinking") if tail and tail[0].get("role") == "assistant" else None
        mode = bool(thinking) if thinking is not None else bool(old_mode if old_mode is not None else True)
        text = new_text if new_text is not None else self._messages[last_user]["content"]
        history = self._messages[:last_user]
        turn = self._turn
        closed = mode and budget == 0
        if turn is not None and self._cache is not None and len(tail) <= 1:
            if new_text is None and mode == turn.thinking and closed == turn.closed_think:
                # regenerate: back to just before the prompt's last token, and feed that one token again
                plan = _Plan(
                    [turn.last_token], text, history, turn.prefix, turn.close_before,
                    restore=turn.before_last, turn_start=turn.before_turn, can_roll_back=False,
                )
                self._run_turn(job, m, start, plan, mode, sampling, budget)
                return
            if turn.prefix is not None:
                # edit (or another thinking mode): back to before the user message; feed the new turn
                prompt = turn.prefix + self._template(m, [{"role": "user", "content": text}], mode)
                plan = _Plan(
                    self._close_thinking(m, prompt, mode, budget), text, history, turn.prefix, turn.close_before,
                    restore=turn.before_turn, turn_start=turn.before_turn, can_roll_back=new_text is not None,
                )
                self._run_turn(job, m, start, plan, mode, sampling, budget)
                return
        # No snapshot for this turn (a reopened conversation): read the conversation once.
        self._drop_cache()
        self._model = m
        prefix, prompt = self._full_parts(m, history, text, mode)
        plan = _Plan(self._close_thinking(m, prompt, mode, budget), text, history, prefix, "", keep_user_on_stop=new_text is None)
        self._messages = history
        self._run_turn(job, m, start, plan, mode, sampling, budget)

    # -- the turn --------------------------------------------------------------------------------------
    def _check_limits(self, m: LoadedModel, prompt_len: int, cached: int) -> int:
        """Raise before any work when the prompt does not fit; return the context limit."""
        limit = min(self.options.context_limit or m.info.max_context, m.info.max_context)
        total = cached + prompt_len
        if total + 1 > limit:
            left = max(limit - cached, 0)
            raise EngineError(
                f"This message needs {prompt_len:,} tokens but only {left:,} of the {limit:,}-token context are left. "
                "Start a new conversation, shorten the message, or raise the context limit.",
                ev.CONTEXT_LIMIT,
            )
        budget = self.options.memory_budget_bytes or self.engine.memory_budget_bytes()
        if budget and m.arch is not None:
            from macapp.core import sizing

            need = (
                m.weights_bytes
                + sizing.kv_cache_bytes(m.arch, total, self.options.kv_bits)
                + sizing.state_bytes(m.arch)
                + sizing.prefill_bytes(m.arch, prompt_len, self.options.prefill_step_size)
                + sizing.runtime_bytes(m.weights_bytes)
            )
            if need > budget:
                raise EngineError(
                    f"Reading this message would take about {need / 1e9:.1f} GB ({total:,} tokens of context), more than "
                    f"the {budget / 1e9:.1f} GB budget for the model. Start a new conversation, turn on KV-cache "
                    "quantization, or use a smaller model.",
                    ev.MEMORY_BUDGET,
                )
        return limit

    def _run_turn(self, job: Job, m: LoadedModel, start: float, plan: _Plan, thinking: bool, sampling: SamplingParams | None, budget: int | None) -> None:
        params = sampling if sampling is not None else preset(thinking)
        try:
            params.validate()
        except ValueError as exc:
            raise EngineError(f"Bad sampling setting: {exc}.", ev.ERROR) from exc
        if budget is not None and budget < 0:
            raise EngineError("The thinking budget must be 0 or more tokens.", ev.ERROR)
        if self.options.kv_bits not in (None, 4, 8):
            raise EngineError(f"kv_bits must be 4 or 8, not {self.options.kv_bits}.", ev.ERROR)
        cached = plan.restore.length if plan.restore is not None else len(self.tokens)
        limit = self._check_limits(m, len(plan.prompt), cached)
        try:
            reply = self._prefill_and_generate(job, m, start, plan, thinking, params, budget, limit)
        except Exception:
            self._drop_cache()  # the cache is in an unknown state: the next send re-reads the conversation
            self._model = m
            raise
        if reply is not None:
            job.emit(Finished(reply))

    def _prefill_and_generate(self, job, m, start, plan, thinking, params, budget, limit) -> Reply | None:
        import mlx.core as mx
        from mlx_lm.generate import generation_stream, maybe_quantize_kv_cache, wired_limit
        from mlx_lm.models.cache import make_prompt_cache

        opts = self.options
        kv = dict(kv_bits=opts.kv_bits, kv_group_size=opts.kv_group_size, quantized_kv_start=opts.quantized_kv_start)
        if self._cache is None:
            self._cache = make_prompt_cache(m.model)
            self.tokens = []
        cache = self._cache
        prev_turn = self._turn
        if plan.restore is not None:
            restore_snapshot(cache, plan.restore)
            del self.tokens[plan.restore.length :]
        turn_start = plan.turn_start or take_snapshot(cache, len(self.tokens))
        self._messages = list(plan.history)
        mx.reset_peak_memory()
        prompt = plan.prompt
        total = len(prompt)
        stop = job._stop
        with wired_limit(m.model, [generation_stream]):
            # Prefill all but the last prompt token here (the same steps as mlx-lm's generate_step), to
            # report progress, honour stop between chunks and snapshot the cache right before the reply.
            # A stop during a chunk is answered at once by Job.stop(); the turn is undone after the chunk.
            job.emit(PromptProgress(0, total))
            prefill_start = time.perf_counter()
            done = 0
            step = max(1, opts.prefill_step_size)

            def roll_back() -> None:
                restore_snapshot(cache, turn_start)
                del self.tokens[turn_start.length :]
                self._close_text = plan.close_before
                self._turn = prev_turn if plan.restore is None else None
                if plan.keep_user_on_stop:  # not read yet: the next send reads it all, this message included
                    self._drop_cache()
                    self._model = m
                    self._messages.append({"role": "user", "content": plan.user_text})

            stopped = Finished(
                Reply(thinking=thinking, finish_reason="stopped", kept=False, stats=GenerationStats(finish_reason="stopped", context_tokens=turn_start.length))
            )
            if plan.can_roll_back:
                job._arm_stop_reply(stopped)
            with mx.stream(generation_stream):
                while total - done > 1:
                    if plan.can_roll_back and stop.is_set():
                        break
                    n = min(step, total - done - 1)
                    m.model(mx.array(prompt[done : done + n])[None], cache=cache)
                    maybe_quantize_kv_cache(cache, **kv)
                    mx.eval([c.state for c in cache])
                    self.tokens.extend(prompt[done : done + n])
                    done += n
                    job.emit(PromptProgress(done, total))
                    mx.clear_cache()
            if plan.can_roll_back and (job._arm_stop_reply(None) or stop.is_set()):
                roll_back()
                stopped.reply.stats.elapsed_s = time.perf_counter() - start
                job.emit(stopped)  # ignored if stop() already sent it
                return None
            before_last = take_snapshot(cache, len(self.tokens))
            self._turn = _Turn(turn_start, plan.close_before, plan.prefix, before_last, prompt[-1], thinking, thinking and budget == 0)
            self._messages.append({"role": "user", "content": plan.user_text})
            reply, still_reasoning = self._stream_reply(job, m, start, prefill_start, prompt, thinking, params, budget, limit, kv)
        last = self.tokens[-1] if self.tokens else None
        if last is not None and last == m.im_end_id:
            self._close_text = "\n"
        elif still_reasoning:
            self._close_text = "\n</think>\n\n<|im_end|>\n"
        else:
            self._close_text = "<|im_end|>\n"
        self._messages.append(
            {"role": "assistant", "content": reply.text, "reasoning": reply.reasoning, "thinking": thinking, "finish_reason": reply.finish_reason}
        )
        self.last_reply = reply
        return reply

    def _stream_reply(self, job, m, start, prefill_start, prompt, thinking, params, budget, limit, kv) -> tuple[Reply, bool]:
        """Generate with mlx-lm's stream_generate; only cheap work per token."""
        import mlx.core as mx
        from mlx_lm.generate import stream_generate

        tok = m.tokenizer
        stop = job._stop
        emit = job.emit
        splitter = ThinkingSplitter(in_reasoning=thinking and budget != 0)
        feed = splitter.feed
        sampler, processors = make_sampler_and_processors(params)
        if params.seed is not None:
            mx.random.seed(params.seed)
        stats = GenerationStats()
        generated: list[int] = []
        append = generated.append
        perf = time.perf_counter
        segment = [prompt[-1]]
        remaining = params.max_tokens
        finish = "length"
        reasoning_count = forced = 0
        budget_hit = False
        first_t = last_t = 0.0
        next_stats = 0.0

        def deliver(pieces: list[tuple[str, str]]) -> None:
            for kind, piece in pieces:
                emit(AnswerDelta(piece) if kind == ANSWER else ReasoningDelta(piece))

        while True:
            room = limit - len(self.tokens) - len(segment)  # tokens the reply may still add to the cache
            cap = min(remaining, room)
            if cap <= 0:
                finish = "context" if room <= 0 else "length"
                break
            gen = stream_generate(
                m.model, tok, mx.array(segment), max_tokens=cap, sampler=sampler, logits_processors=processors,
                prompt_cache=self._cache, prefill_step_size=self.options.prefill_step_size, **kv,
            )
            self.tokens.extend(segment)
            force_close = False
            n_seg = 0
            for r in gen:
                now = perf()
                if not first_t:
                    first_t = now
                    stats.ttft_s = now - start
                    stats.prompt_tokens = len(prompt)
                    stats.prompt_tps = len(prompt) / max(now - prefill_start, 1e-9)
                    emit(PromptProgress(len(prompt), len(prompt)))
                last_t = now
                append(r.token)
                n_seg += 1
                if splitter.in_reasoning:
                    reasoning_count += 1
                if r.text:
                    deliver(feed(r.text))
                if r.finish_reason is not None:
                    finish = r.finish_reason
                    break
                if stop.is_set():
                    finish = "stopped"
                    break
                if budget is not None and reasoning_count >= budget and splitter.in_reasoning:
                    force_close = True
                    break
                if now >= next_stats:
                    next_stats = now + STATS_INTERVAL_S
                    n = len(generated)
                    stats.generation_tokens = n
                    stats.reasoning_tokens = reasoning_count
                    stats.generation_tps = (n - 1) / (now - first_t) if now > first_t else 0.0
                    stats.elapsed_s = now - start
                    stats.peak_memory_bytes = int(mx.get_peak_memory())
                    stats.context_tokens = len(self.tokens) + n_seg
                    emit(StatsUpdate(replace(stats)))
            gen.close()
            self.tokens.extend(generated[len(generated) - n_seg :])
            remaining -= n_seg
            if force_close:
                if remaining <= 0:
                    finish = "length"
                    break
                budget_hit = True
                close_text = "</think>\n\n" if splitter.reasoning_text.endswith("\n") else "\n</think>\n\n"
                deliver(feed(close_text))
                segment = list(tok.encode(close_text, add_special_tokens=False))
                forced += len(segment)
                continue
            if finish == "length" and n_seg == cap and cap < remaining + n_seg:
                finish = "context"  # the context limit, not max_tokens, ended the reply
            break
        deliver(splitter.flush())
        end = perf()
        n = len(generated)
        stats.generation_tokens = n
        stats.reasoning_tokens = reasoning_count
        stats.forced_tokens = forced
        stats.generation_tps = (n - 1) / (last_t - first_t) if last_t > first_t else 0.0
        stats.elapsed_s = end - start
        stats.peak_memory_bytes = int(mx.get_peak_memory())
        stats.context_tokens = len(self.tokens)
        stats.finish_reason = finish
        reply = Reply(
            text=splitter.answer_text,
            reasoning=splitter.reasoning_text,
            thinking=thinking,
            finish_reason=finish,
            stats=stats,
            budget_hit=budget_hit,
            token_ids=generated,
        )
        return reply, splitter.in_reasoning
