"""The server's Backend: the serving core's ServingEngine (macapp.core.serving.runner) on an Engine's loaded model."""

from __future__ import annotations

from macapp.core.engine import Engine, SessionOptions
from macapp.core.engine.options import MTPMode
from macapp.core.prompt_disk import DiskStore
from macapp.core.serving.runner import ServingEngine, ServingOptions


def serving_backend(
    engine: Engine,
    context: int | None = None,
    kv_bits: int | None = None,
    queue_limit: int = 8,
    pool_bytes: int | None = None,
    parallel: int | None = None,
    batching: bool | None = None,
    mtp: MTPMode = MTPMode.AUTO,
    disk: DiskStore | None = None,
) -> ServingEngine:
    """A ServingEngine for the model loaded in `engine` (its own prompt checkpoints; the chat keeps its session).
    `pool_bytes`: the checkpoints' size (None: from the memory budget; 0: none). `parallel`: at most this many
    requests decoding together (None: as many as fit); an engine that cannot batch (several Macs) serves one at a time
    and keeps no checkpoint on disk. `disk`: the prompt checkpoints on disk too (macapp.core.prompt_disk)."""
    session = SessionOptions(context_limit=context, kv_bits=kv_bits, mtp=mtp)  # MTP: for a request alone (engine/solo.py)
    batches = bool(getattr(engine, "batches", True))
    options = ServingOptions(
        disk=disk if batches else None,
        session=session,
        queue_limit=queue_limit,
        pool_bytes=pool_bytes,
        parallel=parallel,
        batching=batches if batching is None else batching,
    )
    return ServingEngine(engine, options)


def backend_for(engine: Engine | None, disk: DiskStore | None = None) -> ServingEngine:
    """As serving_backend, for the window: RuntimeError with the reason when no model is loaded."""
    if engine is None or engine.loaded is None:
        raise RuntimeError("Load a model first: the server answers with the model loaded for the chat.")
    return serving_backend(engine, disk=disk)
