"""Command-line pieces for several Macs: `fit --hosts N`, and `--hostfile` on `chat` and `serve`."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from types import FrameType

from macapp.cli import UsageError
from macapp.core import hardware
from macapp.core.catalog import ModelRef
from macapp.core.cluster import rank
from macapp.core.cluster.hostfile import HostfileError
from macapp.core.cluster.launch import ClusterError, ClusterRun, ShardError, prepare
from macapp.core.cluster.split import Shard
from macapp.core.engine import Engine
from macapp.core.fit.cluster import DEFAULT_LINK, LINKS, MAX_HOSTS, ClusterEstimate, cluster_estimate

VERDICT_WORDS = {"fits": "fits", "tight": "tight", "too_big": "too big"}  # a fit verdict in words (fit and its several-Macs part)


def _hosts(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hosts {text!r} is not a number of Macs") from None
    if not 1 <= n <= MAX_HOSTS:
        raise argparse.ArgumentTypeError(f"--hosts must be between 1 and {MAX_HOSTS}, not {n}")
    return n


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hosts", type=_hosts, metavar="N", help="size it across N such Macs (MLX distributed)")
    parser.add_argument(
        "--shard",
        choices=[s.value for s in Shard],
        help="with --hosts: tensor parallelism (default where the head counts allow it) or pipeline stages",
    )
    parser.add_argument(
        "--link",
        choices=sorted(LINKS),
        help=f"with --hosts: the network the speed estimate assumes (default {DEFAULT_LINK})",
    )


def check_fit_arguments(args: argparse.Namespace) -> None:
    """--shard and --link size several Macs: without --hosts they would be silently ignored."""
    if args.hosts is None and (args.shard or args.link):
        raise UsageError("--shard and --link go with --hosts N")


def run_cluster_fit(args: argparse.Namespace, model: ModelRef, machine: hardware.MachineProfile) -> int:
    shard = Shard(args.shard) if args.shard else None
    try:
        result = cluster_estimate(model, args.context, machine, args.hosts, shard=shard, kv_bits=args.kv_bits, link=args.link or DEFAULT_LINK)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(describe_cluster(result, machine))
    return 0


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def describe_cluster(e: ClusterEstimate, machine: hardware.MachineProfile) -> str:
    """The short human breakdown for the busiest host."""
    s, b = e.single, e.busiest
    bits = f"{s.bits}-bit" if s.bits else "bf16"
    lines = [f"{s.model} ({bits}) at {s.context:,} tokens on {e.hosts} × {machine.chip}, {machine.memory_bytes / 1024**3:.0f} GB each, {e.shard.value} split"]
    if e.tensor_problems:
        lines.append(f"  tensor parallelism cannot split it {e.hosts} ways ({'; '.join(e.tensor_problems)}): sized as a pipeline instead")
    if e.shard is Shard.PIPELINE:
        lines.append("  layers: " + ", ".join(f"rank {h.rank} {h.layers[0]}–{h.layers[1] - 1}" for h in e.per_host) + " (rank 0 runs the last ones)")
    lines += [
        f"  busiest host (rank {b.rank}):",
        f"    weights share  {_gb(b.weights_share):>10}  + {_gb(b.whole_weights)} every host keeps whole",
        f"    KV cache       {_gb(b.kv_cache):>10}",
        f"    DeltaNet state {_gb(b.state):>10}",
        f"    overhead       {_gb(b.overhead):>10}",
        f"    total          {_gb(b.total):>10}  of a {_gb(machine.budget_bytes)} GPU budget → {VERDICT_WORDS[e.verdict].upper()}"
        f" (one Mac: {VERDICT_WORDS[s.verdict]}, {_gb(s.total_bytes)})",
        f"  largest context that fits: {e.max_context:,} tokens" if e.max_context else "  no context fits on these hosts",
    ]
    if e.decode_tps_estimate is not None:
        lines.append(
            f"  speed (estimate): ~{e.decode_tps_estimate:.0f} tok/s early in a chat (one Mac: ~{s.decode_tps_estimate:.0f}), "
            f"with {e.exchange_ms_per_token:.1f} ms/token of exchanges over {e.link.description}"
        )
    else:
        lines.append("  speed: no estimate (not an Apple Silicon Mac)")
    return "\n".join(lines)


# --- chat / serve on several Macs ---


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """--hostfile, --shard, --backend for `chat` and `serve`."""
    group = parser.add_argument_group("several Macs (MLX distributed)")
    group.add_argument(
        "--hostfile", metavar="FILE", help='run across the Macs in this MLX hostfile (JSON list of {"ssh": host, "ips": [...]}); the first is rank 0'
    )
    group.add_argument(
        "--shard", choices=[s.value for s in Shard], help="with --hostfile: tensor parallelism (default where the head counts allow it) or pipeline stages"
    )
    group.add_argument("--backend", choices=("ring", "jaccl"), help="with --hostfile: ring (TCP, default) or jaccl (RDMA over Thunderbolt 5, macOS 26.2+)")


def launch_or_follow(args: argparse.Namespace, prompts: list[str] | None = None, reads_input: bool = False) -> int | None:
    """With --hostfile, in the process the user started: check, start every rank through mlx.launch, watch
    them, and return the run's exit status (`reads_input`: rank 0 reads this terminal, as the interactive chat
    does). In a launched follower rank: follow rank 0 and return its status. None where the command should go
    on as usual (no --hostfile, or this is rank 0)."""
    spec = rank.launched_spec()
    if spec is not None:
        return None if rank.rank() == 0 else rank.follow(spec, args.model, context=getattr(args, "context", None))
    if not getattr(args, "hostfile", None):
        if getattr(args, "shard", None) or getattr(args, "backend", None):
            raise UsageError("--shard and --backend go with --hostfile")
        return None
    return _launch(args, prompts or [], reads_input)


def engine_for() -> Engine:
    """The engine for this process: rank 0's cluster engine inside a launched run, else the usual one."""
    spec = rank.launched_spec()
    return rank.engine_for_rank0(spec) if spec is not None else Engine()


def _rank_argv(prompts: list[str]) -> list[str]:
    """This command line for the ranks, with the prompts as read here (a '-' read stdin: ranks have none)."""
    argv, out, k = sys.argv[1:], [], 0
    for i, arg in enumerate(argv):
        if i and argv[i - 1] in ("--prompt", "-p") and k < len(prompts):
            arg, k = prompts[k], k + 1
        elif arg.startswith("--prompt=") and k < len(prompts):
            arg, k = "--prompt=" + prompts[k], k + 1
        out.append(arg)
    if getattr(sys, "frozen", False):  # the packaged app's executable is the command itself
        return [sys.executable, *out]
    return [sys.executable, "-m", "macapp", *out]


def _launch(args: argparse.Namespace, prompts: list[str], reads_input: bool) -> int:
    try:
        plan = prepare(args.hostfile, args.backend, args.model, Shard(args.shard) if args.shard else None)
    except (HostfileError, ShardError) as exc:
        raise UsageError(str(exc)) from None
    except ClusterError as exc:
        print(f"qwen-desk: {exc}", file=sys.stderr)
        return 1
    hosts = plan.hostfile.hosts
    note = f" (tensor parallelism not possible: {'; '.join(plan.tensor_problems)})" if plan.tensor_problems else ""
    print(f"[{len(hosts)} hosts, {plan.shard.value} split{note}, {plan.backend} backend; rank 0 is {hosts[0].ssh}]", file=sys.stderr)
    run = ClusterRun(plan, _rank_argv(prompts), interactive=reads_input)

    def on_sigint(_sig: int, _frame: FrameType | None) -> None:
        if not run.interrupt():
            print("\n[Ctrl-C reaches rank 0 only when it runs on this Mac (127.0.0.1 first in the hostfile); /quit ends the chat]", file=sys.stderr)

    def on_stop(sig: int, _frame: FrameType | None) -> None:
        run.stop(sig)

    previous = {sig: signal.signal(sig, handler) for sig, handler in ((signal.SIGINT, on_sigint), (signal.SIGTERM, on_stop), (signal.SIGHUP, on_stop))}
    try:
        run.start()
        return run.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        run.close()
