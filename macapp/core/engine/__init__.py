"""The inference engine: one long-lived worker thread owns MLX, the model and every chat cache.

Public API (everything returns at once; work happens on the worker, in submission order):

    engine = Engine()                                   # the worker starts on first use
    job = engine.load("path/or/org/repo")               # -> Job ending in Loaded | Failed
    session = engine.new_session(system_prompt=None, messages=None, options=SessionOptions())
    job = session.send(text, thinking=True, sampling=None, thinking_budget=None)
    job = session.send(text, images=[path, ...])         # pictures: mlx-vlm's tower + mRoPE (macapp.core.vision)
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

For extensions (work submitted with `engine.submit(kind, work)`, on the worker, with `engine.model`):
`prefill(model, cache, tokens, ...)` reads a prompt into any mlx-lm prompt cache, and `run_alone(model, sequence)`
runs one Sequence (a PromptCache, the tokens to read, a SequenceReply: the engine's events, statistics, thinking
budget, stop and context cap) to its end, as the batch loop runs a sequence alone; a `TurnClock` times them.

The modules: jobs (Job and its listeners), worker (the one MLX thread), model_folder (find, check, load),
prompt_cache (PromptCache: one sequence's layers, tokens and pictures, the one owner of a cache),
positions (SavedPosition: a point in a cache, for regenerate/edit/undo, the API's pool, several Macs and
the disk), turns (turn
plans), limits (what a turn may ask for), prefill (reading a prompt), reply (SequenceReply: a reply's bookkeeping,
token by token), clock (its statistics), batch (the batch loop: continuous batching on mlx-lm's BatchGenerator),
solo (a sequence alone, MTP drafting there), sequence (Sequence: one sequence of the batch loop, a chat turn or a
request), session (ChatSession), engine (Engine), options
(SessionOptions), errors (EngineError), pictures (pictures in a turn or a request: opened, the loaded model's
tower, room in the context), model_proxy (the seam a model run otherwise plugs into: several Macs' LockstepModel).

Design:
- One worker thread per process (shared by Engine objects) does all MLX work; it never ends, because with
  mlx 0.32 a process whose MLX thread has exited can abort at exit.
- One path: every chat turn and every API request is a Sequence of the engine's batch loop. Alone, it is read and
  decoded by the lone executor (solo.py: mlx-lm's generate_step pipelining, MTP drafts there) with nothing added per
  token but the reply's bookkeeping, so decode speed is mlx-lm's; beside others, it decodes in mlx-lm's
  `BatchGenerator` (batch.py), and it moves between the two at token boundaries.
- Each session keeps ONE prompt cache and appends only the new turn: the previous reply is closed with
  ``<|im_end|>\\n`` (or just ``\\n`` when the model wrote it) and only the new user message is templated,
  with an explicit ``enable_thinking`` every turn. Qwen3.5's DeltaNet cache cannot be trimmed, so the trade
  is knowing: within a session earlier replies keep their reasoning in the context (cheap, never re-read);
  a session opened from saved `messages` is read once through the real template (which drops old
  reasoning), then appended to.
- Regenerate and edit do not re-read the conversation: before each turn the engine marks the cache (a
  SavedPosition, positions.py: KV layers' lengths, since they only grow; DeltaNet layers: references to their
  immutable state arrays), and again just before the prompt's last token. Regenerate restores the second and prefills one
  token (or the user turn when the thinking mode changes); edit restores the first and prefills the new
  user turn. A mark costs no copy; it keeps the DeltaNet states alive (`ChatSession.snapshot_bytes`).
- The thinking budget closes the reasoning after N reasoning tokens by feeding ``</think>\\n\\n`` to the
  model and letting it answer.
- Stop: checked on every token. A reply stopped while generating is kept (finish_reason "stopped") and
  the next turn closes it. Stopped while its prompt is still being read, a send or edit is undone
  (Reply.kept False: the conversation is as before it): `Job.stop()` has that Finished emitted at once
  (from a helper thread, never inside the caller's stop()) and the worker undoes the turn when the
  prefill chunk in flight ends, before any later job runs (`Job.join()` waits for that). A regenerate
  from a mark re-reads one short turn and stops at its first token instead, so its user message is
  never lost.
- Bad input fails before any work, with a code from events.py: missing folder, not a Qwen3.5 model,
  corrupt files, no model loaded, empty prompt, prompt over the context limit or the memory budget.
"""

from macapp.core.engine.clock import STATS_INTERVAL_S, TurnClock
from macapp.core.engine.engine import Engine
from macapp.core.engine.errors import EngineError
from macapp.core.engine.jobs import NOTIFY_INTERVAL_S, Job
from macapp.core.engine.model_folder import LoadedModel, check_model_folder, load_model, locate_model
from macapp.core.engine.options import KVQuantization, SessionOptions
from macapp.core.engine.prefill import prefill, wired_memory
from macapp.core.engine.reply import Limits, SequenceReply, StreamedReply
from macapp.core.engine.sequence import Sequence
from macapp.core.engine.solo import run_alone
from macapp.core.engine.session import ChatSession
from macapp.core.engine.positions import SavedPosition, mark, restore, rewind, save
from macapp.core.engine.worker import start_worker
from macapp.core.modelfiles import safetensors_problem

__all__ = [
    "start_worker",
    "NOTIFY_INTERVAL_S",
    "STATS_INTERVAL_S",
    "ChatSession",
    "Engine",
    "EngineError",
    "Job",
    "KVQuantization",
    "LoadedModel",
    "SessionOptions",
    "StreamedReply",
    "TurnClock",
    "check_model_folder",
    "load_model",
    "locate_model",
    "prefill",
    "mark",
    "restore",
    "rewind",
    "save",
    "SavedPosition",
    "safetensors_problem",
    "run_alone",
    "Limits",
    "Sequence",
    "SequenceReply",
    "wired_memory",
]
