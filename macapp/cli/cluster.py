"""Command-line pieces for several Macs: `fit --hosts N`, and `--hostfile` on `chat` and `serve`."""

from __future__ import annotations

import argparse
import json

from macapp.cli import UsageError
from macapp.core import hardware
from macapp.core.catalog import ModelRef
from macapp.core.cluster.sizing import DEFAULT_LINK, LINKS, MAX_HOSTS, ClusterEstimate, Shard, cluster_estimate


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
        "--shard", choices=[s.value for s in Shard],
        help="with --hosts: tensor parallelism (default where the head counts allow it) or pipeline stages",
    )
    parser.add_argument(
        "--link", choices=sorted(LINKS), default=DEFAULT_LINK,
        help=f"with --hosts: the network the speed estimate assumes (default {DEFAULT_LINK})",
    )


def run_cluster_fit(args: argparse.Namespace, model: ModelRef, machine: hardware.MachineProfile) -> int:
    shard = Shard(args.shard) if args.shard else None
    try:
        result = cluster_estimate(model, args.context, machine, args.hosts, shard=shard, kv_bits=args.kv_bits, link=args.link)
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
    from macapp.cli.fit import VERDICT_WORDS

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
