"""Will a build fit on N Macs, and how fast: the one-Mac sizing model (macapp.core.fit.estimate) split per host.

Each host is the same machine. The split follows mlx-lm's Qwen3.5 code exactly:
- tensor (`model.shard`): every layer's projections, experts and shared expert are cut N ways; the KV heads
  are repeated when there are fewer than N (each host then keeps one whole head); the embedding, the router
  gates and the norms stay whole on every host; an untied output head is cut by vocabulary rows.
- pipeline (`model.model.pipeline`): host r runs a contiguous block of layers, rank 0 the last ones, the low
  ranks one extra layer when N does not divide the layer count; every host keeps the embedding, the final
  norm and the output head.
Shares are split from the one-Mac figures so they add up to them exactly (plus, in tensor mode with more
hosts than KV heads, the repeated KV heads, reported as `duplicated`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from macapp.core.fit import estimate, weights
from macapp.core.catalog import Arch, ModelRef
from macapp.core.cluster.split import Shard, SplitRefused, choose_split
from macapp.core.hardware import MachineProfile

MAX_HOSTS = 16


@dataclass(frozen=True)
class Link:
    """The network between the Macs, as the decode estimate assumes it (not measured here)."""

    name: str
    description: str
    bandwidth_gbs: float  # GB/s one way, as a collective sees it
    hop_latency_us: float  # one message from one host to the next


LINKS = {
    "thunderbolt5-rdma": Link("thunderbolt5-rdma", "Thunderbolt 5 with RDMA (JACCL backend, macOS 26.2+), assumed 8 GB/s and 10 µs per hop", 8.0, 10.0),
    "10gbe-tcp": Link("10gbe-tcp", "10 Gigabit Ethernet over TCP (ring backend), assumed 1.1 GB/s and 60 µs per hop", 1.1, 60.0),
}
DEFAULT_LINK = "thunderbolt5-rdma"


@dataclass(frozen=True)
class HostShare:
    """What one host holds (bytes)."""

    rank: int
    layers: tuple[int, int]  # [start, end) of the layers this host runs
    weights_share: int  # its part of the weights that are split
    whole_weights: int  # what every host keeps whole (embedding, norms, router gates; output head in pipeline mode)
    kv_cache: int
    state: int  # its part of the DeltaNet state
    overhead: int  # one prefill chunk's activations + the runtime
    total: int


@dataclass(frozen=True)
class ClusterEstimate:
    hosts: int
    shard: Shard
    requested_shard: Shard | None
    tensor_problems: list[str]  # why tensor parallelism cannot split this model N ways (empty when it can)
    per_host: list[HostShare]
    busiest: HostShare
    duplicated_bytes: int  # weights and KV held by more than one host (repeated KV heads)
    verdict: str
    max_context: int
    link: Link
    exchange_ms_per_token: float
    decode_tps_estimate: float | None
    decode_tps_at_context: float | None
    single: estimate.Estimate
    derivation: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        """The one-Mac fit JSON with `verdict`, `max_context` and the speeds judged per host, plus the cluster fields."""
        data = self.single.to_json()
        data.update(
            hosts=self.hosts,
            shard=self.shard.value,
            per_host_bytes=_share_json(self.busiest),
            hosts_detail=[_share_json(h) for h in self.per_host],
            duplicated_bytes=self.duplicated_bytes,
            tensor_split_possible=not self.tensor_problems,
            tensor_problems=list(self.tensor_problems),
            verdict=self.verdict,
            max_context=self.max_context,
            single_host_verdict=self.single.verdict,
            single_host_max_context=self.single.max_context,
            link={"name": self.link.name, "description": self.link.description},
            exchange_ms_per_token=round(self.exchange_ms_per_token, 3),
            decode_tps_estimate=self.decode_tps_estimate,
            decode_tps_at_context=self.decode_tps_at_context,
            derivation=self.single.derivation + self.derivation,
        )
        return data


def _share_json(h: HostShare) -> dict[str, object]:
    data = asdict(h)
    data["layers"] = list(h.layers)
    return data


# --- the pipeline's layers ---


def pipeline_layers(num_layers: int, hosts: int) -> list[tuple[int, int]]:
    """[start, end) per rank, as mlx-lm's PipelineMixin splits them: rank 0 runs the last layers, the low ranks one more."""
    base, extra = divmod(num_layers, hosts)
    split = [base + (1 if r < extra else 0) for r in range(hosts)]
    out = []
    for r in range(hosts):
        start = sum(split[r + 1 :])
        out.append((start, start + split[r]))
    return out


def is_full_attention(arch: Arch, layer: int) -> bool:
    return (layer + 1) % arch.full_attention_interval == 0


# --- the weights, part by part ---


@dataclass(frozen=True)
class _WeightParts:
    """The computed weight bytes (as macapp.core.fit.estimate counts them) sorted by how a split treats them."""

    linear_layer: int  # one DeltaNet layer's projections
    full_kv: int  # one full-attention layer's k_proj + v_proj
    full_qo: int  # one full-attention layer's q_proj + o_proj
    mlp: int  # one layer's MLP or experts + shared expert
    router: int  # one layer's router gates (kept whole)
    embed: int
    head: int  # the untied output head (0 when tied)
    small: int  # norms, conv kernels, dt_bias, A_log (kept whole: they are tiny)

    def total(self, arch: Arch) -> int:
        per_layer = self.mlp + self.router
        return (
            arch.linear_layers * self.linear_layer
            + arch.full_attention_layers * (self.full_kv + self.full_qo)
            + arch.num_hidden_layers * per_layer
            + self.embed
            + self.head
            + self.small
        )


def _weight_parts(arch: Arch, bits: int | None, group: int) -> _WeightParts:
    q = weights.quantized_bytes  # the one quantization policy
    shapes = weights.layer_tensors(arch)
    main, router = weights.mlp_tensors(arch, active_only=False)
    router_bits = 8 if bits is not None else None
    full = shapes["full"]  # q_proj, k_proj, v_proj, o_proj
    embed = q(arch.vocab_size, arch.hidden_size, bits, group)
    bf16, fp32 = weights.small_params(arch)
    return _WeightParts(
        linear_layer=sum(q(o, i, bits, group) for o, i in shapes["linear"]),
        full_kv=sum(q(o, i, bits, group) for o, i in full[1:3]),
        full_qo=sum(q(o, i, bits, group) for o, i in (full[0], full[3])),
        mlp=sum(q(o, i, bits, group) for o, i in main),
        router=sum(q(o, i, router_bits, group) for o, i in router),
        embed=embed,
        head=0 if arch.tie_word_embeddings else embed,
        small=bf16 * weights.ACT_BYTES + fp32 * weights.STATE_BYTES,
    )


def _split(total: int, weights: list[int]) -> list[int]:
    """`total` split in proportion to `weights`, in whole bytes that add up to `total` exactly."""
    scale = sum(weights)
    if scale <= 0:
        return [0] * len(weights)
    parts = [total * w // scale for w in weights]
    for i in sorted(range(len(weights)), key=lambda i: -weights[i])[: total - sum(parts)]:
        parts[i] += 1
    return parts


@dataclass(frozen=True)
class _Layout:
    """Per host, the split weights and the fractions of the split KV cache and state; the whole parts."""

    shares: list[int]
    whole: int
    kv_weights: list[int]  # the host's part of the one-Mac KV cache is kv_weights[r] / kv_denominator
    kv_denominator: int
    state_weights: list[int]  # in proportion (they add up to the one-Mac state)
    layers: list[tuple[int, int]]
    duplicated_weights: int
    exchange: list[tuple[str, int, int]]  # (collective, bytes per token, count per token)


def _layout(model: ModelRef, shard: Shard, hosts: int) -> _Layout:
    arch = model.arch
    parts = _weight_parts(arch, model.bits, model.group_size)
    computed = parts.total(arch)
    exact = weights.weights_of(model)[0]
    h2 = arch.hidden_size * weights.ACT_BYTES  # one token's hidden state
    if shard is Shard.TENSOR:
        kv = arch.num_key_value_heads
        kv_held = max(1, kv // hosts)  # heads per host after mlx-lm repeats them
        kv_split = arch.full_attention_layers * parts.full_kv
        kv_dup = kv_split * (hosts * kv_held - kv) // kv
        split = (
            arch.linear_layers * parts.linear_layer + arch.full_attention_layers * parts.full_qo + kv_split + arch.num_hidden_layers * parts.mlp + parts.head
        )
        split_exact = split * exact // computed
        dup_exact = kv_dup * exact // computed
        shares = [s + dup_exact // hosts for s in _split(split_exact, [1] * hosts)]
        exchange = [("all_sum", h2, 2 * arch.num_hidden_layers)]  # mixer and MLP outputs, every layer
        if not arch.tie_word_embeddings:
            exchange.append(("all_gather", arch.vocab_size * weights.ACT_BYTES, 1))  # the output head's vocabulary slices
        return _Layout(shares, exact - split_exact, [kv_held] * hosts, kv, [1] * hosts, [(0, arch.num_hidden_layers)] * hosts, dup_exact, exchange)
    layers = pipeline_layers(arch.num_hidden_layers, hosts)
    per_layer = [
        (parts.full_kv + parts.full_qo if is_full_attention(arch, i) else parts.linear_layer) + parts.mlp + parts.router for i in range(arch.num_hidden_layers)
    ]
    host_layers = [sum(per_layer[a:b]) for a, b in layers]
    split_exact = sum(host_layers) * exact // computed
    shares = _split(split_exact, host_layers)
    full = [sum(is_full_attention(arch, i) for i in range(a, b)) for a, b in layers]
    linear = [(b - a) - f for (a, b), f in zip(layers, full)]
    exchange = [("send", h2, hosts - 1), ("all_gather", h2, 1)]  # stage to stage, then the last hidden state to all
    return _Layout(shares, exact - split_exact, full, max(1, arch.full_attention_layers), linear, layers, 0, exchange)


# --- per host ---


def _hosts(model: ModelRef, layout: _Layout, context: int, kv_bits: int | None, prefill_step: int) -> list[HostShare]:
    arch = model.arch
    kv = estimate.kv_cache_bytes(arch, context, kv_bits)
    state = estimate.state_bytes(arch)
    prefill = estimate.prefill_bytes(arch, context, prefill_step)  # each host holds a whole chunk's hidden states
    if sum(layout.kv_weights) == layout.kv_denominator:
        kv_parts = _split(kv, layout.kv_weights)
    else:  # repeated KV heads: each host keeps its own copy
        kv_parts = [kv * w // layout.kv_denominator for w in layout.kv_weights]
    state_parts = _split(state, layout.state_weights)
    out = []
    for rank, share in enumerate(layout.shares):
        held = estimate.memory(share + layout.whole, kv_parts[rank], state_parts[rank], prefill)
        out.append(HostShare(rank, layout.layers[rank], share, layout.whole, held.kv_cache, held.state, held.overhead, held.total))
    return out


def _exchange_ms(layout: _Layout, hosts: int, link: Link) -> float:
    """Per generated token: ring collectives cost 2(N-1) hops (all_sum) or N-1 (all_gather); a send one hop.
    The app's own lockstep header (one tiny all_sum per model call) is counted too."""
    latency = link.hop_latency_us / 1e3
    per_byte = 1e3 / (link.bandwidth_gbs * 1e9)
    ms = 2 * (hosts - 1) * latency  # macapp.core.cluster.lockstep: the command header (tokens inline)
    for kind, nbytes, count in layout.exchange:
        if kind == "all_sum":
            ms += count * (2 * (hosts - 1) * latency + 2 * (hosts - 1) / hosts * nbytes * per_byte)
        elif kind == "all_gather":
            ms += count * ((hosts - 1) * latency + (hosts - 1) / hosts * nbytes * per_byte)
        else:
            ms += count * (latency + nbytes * per_byte)
    return ms


def _decode_tps(model: ModelRef, machine: MachineProfile, layout: _Layout, shard: Shard, context: int, kv_bits: int | None, exchange_ms: float) -> float | None:
    if not estimate.has_speed(machine):
        return None
    arch = model.arch
    active = weights.active_weights_bytes(arch, model.bits, model.group_size)
    state, kv = estimate.state_bytes(arch), estimate.kv_cache_bytes(arch, context, kv_bits)
    hosts = len(layout.shares)
    if shard is Shard.TENSOR:
        # Every host runs every layer on its 1/N of the heads and experts, all at once.
        parts = _weight_parts(arch, model.bits, model.group_size)
        whole = arch.num_hidden_layers * parts.router + (parts.embed if arch.tie_word_embeddings else 0)
        kv_share = layout.kv_weights[0] / layout.kv_denominator
        read = estimate.decode_read_bytes(whole + (active - whole) / hosts, state / hosts, kv * kv_share)
        step = estimate.decode_step_ms(arch, machine, read, arch.num_hidden_layers)
    else:
        # One token passes the stages in turn: the same bytes as one Mac, in N pieces, plus the exchanges.
        step = estimate.decode_step_ms(arch, machine, estimate.decode_read_bytes(active, state, kv), arch.num_hidden_layers)
    return round(1000.0 / (step + exchange_ms), 1)


def cluster_estimate(
    model: ModelRef,
    context: int,
    machine: MachineProfile,
    hosts: int,
    shard: Shard | None = None,
    kv_bits: int | None = None,
    link: str = DEFAULT_LINK,
    prefill_step: int = estimate.DEFAULT_PREFILL_STEP,
) -> ClusterEstimate:
    """Memory per host, verdict and largest context per host, and speed for `model` on `hosts` copies of `machine`.
    Tensor parallelism asked for but impossible is reported in `tensor_problems` and the pipeline split sized instead."""
    if not 1 <= hosts <= MAX_HOSTS:
        raise ValueError(f"hosts must be between 1 and {MAX_HOSTS}, not {hosts}")
    if link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}, not {link!r}")
    single = estimate.estimate(model, context, machine, kv_bits=kv_bits, prefill_step=prefill_step)
    arch = model.arch
    split = choose_split(arch, hosts, model.bits, model.group_size, asked=shard, fall_back=True, name=model.name)
    chosen, problems = split.shard, list(split.tensor_problems)
    layout = _layout(model, chosen, hosts)
    per_host = _hosts(model, layout, context, kv_bits, prefill_step)
    busiest = max(per_host, key=lambda h: h.total)
    budget = machine.budget_bytes

    def busiest_total(tokens: int) -> int:
        return max(h.total for h in _hosts(model, layout, tokens, kv_bits, prefill_step))

    largest = estimate.largest_context(busiest_total, budget, arch.max_position_embeddings)
    the_link = LINKS[link]
    exchange = _exchange_ms(layout, hosts, the_link) if hosts > 1 else 0.0
    early = _decode_tps(model, machine, layout, chosen, min(context, estimate.EARLY_CONTEXT), kv_bits, exchange)
    late = _decode_tps(model, machine, layout, chosen, context, kv_bits, exchange)
    kv_dup = sum(h.kv_cache for h in per_host) - single.kv_cache_bytes
    gb = 1e9
    derivation = [
        f"{hosts} hosts, {chosen.value} split"
        + (f" (tensor parallelism is not possible: {'; '.join(problems)})" if problems else "")
        + f": the busiest host (rank {busiest.rank}) holds {busiest.weights_share / gb:.2f} GB of split weights + "
        f"{busiest.whole_weights / gb:.2f} GB every host keeps whole, {busiest.kv_cache / gb:.2f} GB KV cache, "
        f"{busiest.state / 1e6:.0f} MB DeltaNet state, {busiest.overhead / gb:.2f} GB overhead = {busiest.total / gb:.2f} GB "
        f"of its {budget / gb:.2f} GB budget",
    ]
    if chosen is Shard.PIPELINE:
        derivation.append("layers per host (rank 0 runs the last ones): " + ", ".join(f"rank {h.rank} {h.layers[0]}–{h.layers[1] - 1}" for h in per_host))
    if early is not None:
        derivation.append(
            f"speed ≈ {early:.0f} tok/s: each host's share of the bytes read per token, plus {exchange:.2f} ms of exchanges per token "
            f"over {the_link.description}. An estimate, not a measurement."
        )
    return ClusterEstimate(
        hosts=hosts,
        shard=chosen,
        requested_shard=shard,
        tensor_problems=problems,
        per_host=per_host,
        busiest=busiest,
        duplicated_bytes=layout.duplicated_weights + max(0, kv_dup),
        verdict=estimate.verdict_for(busiest.total, budget),
        max_context=largest,
        link=the_link,
        exchange_ms_per_token=exchange,
        decode_tps_estimate=early,
        decode_tps_at_context=late,
        single=single,
        derivation=derivation,
    )


def hosts_needed(model: ModelRef, context: int, machine: MachineProfile, kv_bits: int | None = None, most: int = 8) -> int | None:
    """The fewest copies of `machine` that hold `model` at `context` (best split each time); None past `most`."""
    for hosts in range(1, most + 1):
        try:
            if cluster_estimate(model, context, machine, hosts, kv_bits=kv_bits).verdict != "too_big":
                return hosts
        except SplitRefused:  # no split runs it on this many hosts (nor on more)
            return None
    return None
