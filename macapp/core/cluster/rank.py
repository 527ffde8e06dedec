"""Inside a launched rank: join the group, read this rank's shard, and either drive (rank 0) or follow.

`mlx.launch` starts the same command on every host with MLX_RANK set; the launcher (macapp.core.cluster.launch)
adds QWEN_DESK_CLUSTER, a JSON `RankSpec` (split, backend). Rank 0 runs the app's engine with
`engine_for_rank0()`; every other rank calls `follow(model_spec)` and exits with its code.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from macapp.core import events as ev
from macapp.core.cluster.fingerprint import fingerprint
from macapp.core.cluster.lockstep import Follower, LockstepModel, RankLost
from macapp.core.cluster.split import Shard
from macapp.core.cluster.watchdog import Wait, Watchdog
from macapp.core.engine import Engine, EngineError, check_model_folder, locate_model
from macapp.core.engine.model_folder import ModelReader, configured_for, long_context_mode
from macapp.core.jsonvalue import JSONObject

if TYPE_CHECKING:  # naming MLX's types costs nothing at start-up
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper

ENV = "QWEN_DESK_CLUSTER"
READY = "qwen-desk-cluster: rank {rank} of {size} joined"  # on stderr, for the launcher's start-up watch
DONE = "qwen-desk-cluster: rank 0 done"  # on stderr when rank 0 exits
# on stderr from rank 0: mlx.launch may end a follower (SIGTERM) before that follower's own MODEL_DIFFERS exit
OTHER_FILES = "qwen-desk-cluster: other model files on rank {rank}"
FOLLOWER_LOST = 3  # a follower's exit status when rank 0 went away mid-run
MODEL_DIFFERS = 4  # a follower's exit status when its model files are not rank 0's


@dataclass(frozen=True)
class RankSpec:
    shard: Shard
    backend: str
    hosts: int
    control_dir: str = ""  # the launcher's folder for rank 0's pid (Ctrl-C is passed on when rank 0 is local)
    stall_limit_s: float = 0.0  # > 0: a fixed bound on rank 0's waits for the others (else adaptive: watchdog.py)
    load_limit_s: float = 0.0  # > 0: a fixed bound on its waits while loading (else watchdog.FILES_S / LOAD_S)

    def to_env(self) -> str:
        data = asdict(self)
        data["shard"] = self.shard.value
        return json.dumps(data)

    @classmethod
    def from_env(cls, text: str) -> "RankSpec":
        data = json.loads(text)
        return cls(
            Shard(data["shard"]),
            str(data["backend"]),
            int(data["hosts"]),
            str(data.get("control_dir") or ""),
            float(data.get("stall_limit_s") or 0.0),
            float(data.get("load_limit_s") or 0.0),
        )


def launched_spec() -> RankSpec | None:
    """This process's RankSpec when mlx.launch started it for a cluster run; None otherwise."""
    text = os.environ.get(ENV)
    if not text or "MLX_RANK" not in os.environ:
        return None
    return RankSpec.from_env(text)


def rank() -> int:
    return int(os.environ.get("MLX_RANK", "0"))


def join(spec: RankSpec) -> mx.distributed.Group:
    """The distributed group, after saying so on stderr (the launcher waits for every rank's line)."""
    import mlx.core as mx

    group = mx.distributed.init(strict=True, backend=spec.backend)
    if group.size() != spec.hosts:
        raise RuntimeError(f"the group has {group.size()} ranks, the hostfile {spec.hosts}")
    if spec.control_dir and Path(spec.control_dir).is_dir():  # a rank on the launcher's machine: say our pid
        (Path(spec.control_dir) / f"rank{group.rank()}.pid").write_text(str(os.getpid()))
    print(READY.format(rank=group.rank(), size=group.size()), file=sys.stderr, flush=True)
    return group


def start_rank0(spec: RankSpec) -> mx.distributed.Group:
    """Rank 0's set-up: Ctrl-C stops a reply again (mlx.launch's children start with it ignored), the launcher
    learns our pid (to pass Ctrl-C on) and hears when we are done; then join the group."""
    import atexit

    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit.register(lambda: print(DONE, file=sys.stderr, flush=True))
    return join(spec)


def read_shard(path: Path, group: mx.distributed.Group, shard: Shard) -> tuple[nn.Module, TokenizerWrapper, JSONObject]:
    """This rank's part of the model in `path` (mlx-lm's sharded_load), its tokenizer and config."""
    from mlx_lm.utils import sharded_load

    if shard is Shard.TENSOR:
        model, tokenizer, config = sharded_load(str(path), tensor_group=group, return_config=True)
    else:
        model, tokenizer, config = sharded_load(str(path), pipeline_group=group, return_config=True)
    return model, tokenizer, config


def ranks_with_other_files(group: mx.distributed.Group, path: Path) -> list[int]:
    """The ranks whose model files differ from rank 0's (macapp.core.cluster.fingerprint), asked of the whole
    group at once; every rank calls it at the same point, before reading its shard. RankLost if a peer is gone."""
    import mlx.core as mx

    mine = mx.array(list(bytes.fromhex(fingerprint(path).digest)), dtype=mx.int32)[None]
    try:
        gathered = mx.distributed.all_gather(mine, group=group, stream=mx.cpu)
        mx.eval(gathered)  # the wait, with the GIL released (rank 0's watchdog thread must run meanwhile)
        rows = gathered.tolist()
    except RuntimeError as exc:
        raise RankLost(str(exc)) from exc
    if not isinstance(rows, list):  # one row per rank: a 2-D array's tolist() is a list
        raise TypeError(f"all_gather gave {type(rows).__name__}, not one row per rank")
    return [r for r, row in enumerate(rows) if row != rows[0]]


def reader_for_rank0(group: mx.distributed.Group, shard: Shard, watchdog: Watchdog | None = None) -> ModelReader:
    """The engine's model reader on rank 0: the shard, wrapped so that every call is mirrored on the followers.
    Every wait for the others, loading included, is bounded by `watchdog` (a rank stuck while loading ends the run)."""
    dog = watchdog or Watchdog()

    # Any: ModelReader names nn.Module, and a LockstepModel (a ModelProxy) stands in for one
    def read(path: Path) -> tuple[Any, TokenizerWrapper, JSONObject]:
        with dog.waiting(Wait.FILES):
            differ = ranks_with_other_files(group, path)
        if differ:
            for rank in differ:
                print(OTHER_FILES.format(rank=rank), file=sys.stderr, flush=True)
            raise EngineError(
                f"The model files are not the same on every host: rank{'s' if len(differ) > 1 else ''} "
                f"{', '.join(map(str, differ))} hold{'' if len(differ) > 1 else 's'} other files than rank 0 ({path}). "
                "Download the same build on each host.",
                ev.ERROR,
            )
        with dog.waiting(Wait.LOAD):
            model, tokenizer, config = read_shard(path, group, shard)
        return LockstepModel(model, group, dog), tokenizer, config

    return read


class Rank0Engine(Engine):
    """Rank 0's engine: the app's Engine, reading its shard through a LockstepModel (the model proxy that closing
    the engine closes: the followers are shut down on the worker, after every job, so they exit cleanly)."""

    batches = False  # the lockstep channel carries one model call at a time: requests are served one by one


def engine_for_rank0(spec: RankSpec, group: mx.distributed.Group | None = None) -> Rank0Engine:
    """Rank 0's engine, on `group` (default: join the launched run's)."""
    dog = Watchdog(spec.stall_limit_s, spec.load_limit_s)
    return Rank0Engine(read_model=reader_for_rank0(group or start_rank0(spec), spec.shard, dog))


def follow(spec: RankSpec, model_spec: str, group: mx.distributed.Group | None = None, context: int | None = None) -> int:
    """A follower rank's whole life: join (unless `group` is given), load the same folder (in long-context mode when
    `context`, the command's --context, is past its native length, as rank 0 does), follow rank 0 until it shuts
    us down; the exit status (0, 1 for a model that cannot load, MODEL_DIFFERS, FOLLOWER_LOST)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's (it stops the reply)
    sys.stdout = sys.stderr  # rank 0 owns stdout
    group = group or join(spec)
    try:
        path = locate_model(model_spec)
        config, factor = configured_for(check_model_folder(path), path, context)
        if group.rank() in ranks_with_other_files(group, path):
            print(f"qwen-desk: rank {group.rank()}: the model files in {path} are not rank 0's", file=sys.stderr, flush=True)
            return MODEL_DIFFERS
        try:
            model, _tokenizer, _config = read_shard(path, group, spec.shard)
        except RuntimeError as exc:  # a collective of sharded_load: rank 0 went away while loading
            raise RankLost(str(exc)) from exc
        long_context_mode(model, config, factor)
        if factor:  # rank 0 says so too; a follower running without it would compute other positions
            print(f"qwen-desk: rank {group.rank()}: long-context mode: YaRN ×{factor}", file=sys.stderr, flush=True)
        Follower(model, group).run()
    except EngineError as exc:
        print(f"qwen-desk: rank {group.rank()}: {exc.message}", file=sys.stderr, flush=True)
        return 1
    except RankLost as exc:
        print(f"qwen-desk: rank {group.rank()}: lost rank 0 ({exc.detail})", file=sys.stderr, flush=True)
        return FOLLOWER_LOST
    return 0
