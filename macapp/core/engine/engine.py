"""The Engine: the loaded model and the jobs on it; all MLX work runs on the one worker thread, in order."""

from __future__ import annotations

import os
import weakref
from typing import Callable, Protocol

from macapp.core import events as ev
from macapp.core.engine import model_folder, mtp_calibration
from macapp.core.engine.batch import BatchLoop
from macapp.core.engine.jobs import Job
from macapp.core.engine.messages import ChatMessage
from macapp.core.engine.model_folder import LoadedModel
from macapp.core.engine.model_proxy import close_proxy
from macapp.core.engine.options import MTPMode, SessionOptions
from macapp.core.engine.session import ChatSession
from macapp.core.engine.shelf import ShelfFactory
from macapp.core.engine.worker import submit_work
from macapp.core.events import Failed, Loaded, Unloaded
from macapp.core.hardware import detect_machine


class CacheHolder(Protocol):
    """What keeps a cache of the loaded model: a chat session, the API's prompt-checkpoint pool."""

    def forget_cache(self) -> None: ...


class Engine:
    """The loaded model and the jobs on it; all MLX work runs on the one worker thread, in order."""

    batches = True  # sequences may share mlx-lm's batch (several Macs' rank 0 runs them one at a time: cluster.rank)

    def __init__(self, read_model: model_folder.ModelReader = model_folder.read_with_mlx_lm) -> None:
        """`read_model` reads a checked model folder into (model, tokenizer, config): mlx-lm's load by default;
        several Macs pass one that reads this rank's shard (macapp.core.cluster)."""
        self._read_model = read_model
        self._model: LoadedModel | None = None
        self._budget: int | None = None
        self._closed = False
        self._cache_holders: weakref.WeakSet[CacheHolder] = weakref.WeakSet()  # chat sessions and the API's pools
        self._jobs: weakref.WeakSet[Job] = weakref.WeakSet()
        self._batch = BatchLoop(self)
        self.position_shelf: ShelfFactory | None = None  # chat sessions' positions on disk (a front end sets it: shelf.py)

    def submit(self, kind: str, work: Callable[[Job], None]) -> Job:
        """Run `work(job)` on the worker thread (for engine extensions and tests)."""
        if self._closed:
            raise RuntimeError("this engine is closed")
        job = Job(kind)
        self._jobs.add(job)
        submit_work(job, work)
        return job

    def batch_loop(self) -> BatchLoop:
        """The engine's one batch loop (macapp.core.engine.batch): every chat turn and every API request is a sequence
        of it, run on whatever model is loaded when the loop takes it (a load queued before it comes first)."""
        return self._batch

    def new_job(self, kind: str) -> Job:
        """A job whose work runs inside another job (a sequence of the batch loop): stopped, like the rest, on close."""
        if self._closed:
            raise RuntimeError("this engine is closed")
        job = Job(kind)
        self._jobs.add(job)
        return job

    def _forget_caches(self) -> None:
        """Drop every holder's cache (worker thread): they belong to the model being replaced."""
        for holder in list(self._cache_holders):
            holder.forget_cache()

    def hold_caches(self, holder: CacheHolder) -> None:
        """Call `holder.forget_cache()` (on the worker) whenever the model is replaced, unloaded or closed, as for a
        chat session: caches of an extension (the API server's prompt checkpoints) must not outlive their model.
        Held weakly."""
        self._cache_holders.add(holder)

    @property
    def closed(self) -> bool:
        return self._closed

    def stop_jobs(self) -> None:
        """Stop every job of this engine not done yet (each honours it within a token)."""
        for job in list(self._jobs):
            if not job.done:
                job.stop()

    def close(self, timeout: float = 30.0) -> None:
        """Stop this engine's jobs, close a model proxy (several Macs: the followers are shut down), drop the model
        and caches (the worker thread stays, parked)."""
        if self._closed:
            return
        self.stop_jobs()

        def work(job: Job) -> None:
            if self._model is not None:
                close_proxy(self._model.model)
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
    def load(self, spec: str | os.PathLike[str], context: int | None = None, mtp: MTPMode = MTPMode.AUTO) -> Job:
        """Load a model folder or a downloaded repo; the Loaded event reports load time and memory. A `context`
        past the model's native length loads it in long-context mode (YaRN; model_folder.load_model); `mtp` off
        leaves the build's MTP head unread."""

        def work(job: Job) -> None:
            if job.stopped:
                job.emit(Failed("Loading was cancelled.", ev.CANCELLED))
                return
            path = model_folder.locate_model(str(spec))
            config = model_folder.check_model_folder(path)  # refuse bad folders before letting go of the current model
            model_folder.yarn_for(config, path, context)  # and a context it cannot take
            self._forget_caches()  # free the old model and its caches before reading the new one
            self._model = None
            self._model = model_folder.load_model(path, config, self._read_model, context=context, mtp=mtp)
            if mtp is MTPMode.AUTO:  # whether the head pays here: remembered per build and machine, else measured now
                mtp_calibration.calibrate(self._model)
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
                self._budget = int(detect_machine().budget_bytes)
            except Exception:
                return None
        return self._budget

    def new_session(
        self,
        system_prompt: str | None = None,
        messages: list[ChatMessage] | None = None,
        options: SessionOptions | None = None,
    ) -> ChatSession:
        """A conversation; `messages` (role/content[/reasoning] dicts) reopens a saved one."""
        session = ChatSession(self, system_prompt=system_prompt, messages=messages, options=options or SessionOptions())
        self._cache_holders.add(session)
        return session
