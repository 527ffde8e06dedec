"""What to do when a build does not fit: the concrete ways out, in order of what they cost the user.

One function, `advise`, for every front end (`qwen-desk fit`, `qwen-desk models`, the badge's tooltip, the details
pane). The ways out, cheapest first: a shorter context that fits, a quantized KV cache, letting macOS wire more
memory for the GPU (`sudo sysctl iogpu.wired_limit_mb=N` — the app never runs it; when even the most it can safely
give does not hold the whole context, together with the longest context it then allows), and the next build down
that fits.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Iterable

from macapp.core.fit import estimate
from macapp.core.catalog import ModelRef
from macapp.core.hardware import GiB, MachineProfile, max_safe_wired_limit

MiB = 1024**2


class Remedy(str, Enum):
    SHORTER_CONTEXT = "shorter_context"
    KV_CACHE = "kv_cache"
    WIRED_LIMIT = "wired_limit"
    SMALLER_BUILD = "smaller_build"


@dataclass(frozen=True)
class Step:
    remedy: Remedy
    text: str
    context: int | None = None  # the context the step makes fit
    kv_bits: int | None = None
    command: str | None = None  # for the wired limit: the exact command the user may run
    wired_limit_mb: int | None = None
    leaves_bytes: int | None = None  # what the wired limit leaves for macOS and other apps
    model: str | None = None  # for a smaller build: "Qwen3.5-9B 8-bit"
    repo: str | None = None


@dataclass(frozen=True)
class Advice:
    verdict: str
    headline: str  # one sentence: why it does not fit ("" when it fits)
    steps: tuple[Step, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        for step in data["steps"]:
            step["remedy"] = step["remedy"].value
        return data

    def lines(self) -> list[str]:
        """Headline, then the numbered ways out (for text front ends)."""
        if not self.headline:
            return []
        return [self.headline] + [f"{i}. {step.text}" for i, step in enumerate(self.steps, 1)]


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _build_name(model: ModelRef) -> str:
    return f"{model.name} {model.bits}-bit" if model.bits else model.name


def wired_limit_step(model: ModelRef, est: estimate.Estimate, machine: MachineProfile) -> Step | None:
    """The sysctl that gives the GPU room for `est`: for the whole context when the most macOS can safely give
    (hardware.max_safe_wired_limit) is enough (aiming at a 'fits' verdict), else at that most, together with the
    longest context it then allows. None off Apple Silicon, or when the raised limit gains no context over the
    default budget."""
    ceiling = max_safe_wired_limit(machine.memory_bytes)
    if not machine.is_apple_silicon or ceiling <= machine.budget_bytes:
        return None
    # Pictures and the MTP head come on top of the text-only memory and do not shrink with the context.
    extra = est.total_bytes - (est.weights_bytes + est.kv_cache_bytes + est.state_bytes + est.overhead_bytes)
    if est.total_bytes <= ceiling:
        need, context = est.total_bytes, est.context
        wanted = min(max(need / estimate.FITS_SHARE, need + 256 * MiB), ceiling)
        mb = min(math.ceil(wanted / GiB) * 1024, ceiling // MiB)
    else:
        mb = ceiling // MiB
        context = estimate.max_context(model, mb * MiB - extra, est.kv_bits)
        if context <= est.max_context:
            return None
        need = estimate.memory_at(model.arch, est.weights_bytes, context, est.kv_bits, estimate.DEFAULT_PREFILL_STEP).total + extra
    budget = mb * MiB
    leaves = machine.memory_bytes - budget
    command = f"sudo sysctl iogpu.wired_limit_mb={mb}"
    roomy = estimate.verdict_for(need, budget) == "fits"
    if context == est.context:
        gain = f"the whole {context:,}-token context {'fits' if roomy else 'just fits (tight)'}"
    else:
        gain = (
            f"a context of up to {context:,} tokens {'fits' if roomy else 'just fits'} "
            f"(you asked for {est.context:,}{_whole_with_kv_cache(model, est, budget - extra)})"
        )
    text = (
        f"let macOS wire more memory for the GPU: run `{command}` in Terminal. The GPU may then use {_gb(budget)} "
        f"instead of {_gb(machine.budget_bytes)} and {gain}. Risk: that leaves {_gb(leaves)} for macOS and your other "
        f"apps; if they need more, the Mac swaps hard or freezes (quit big apps first). It resets at reboot "
        f"(`sudo sysctl iogpu.wired_limit_mb=0` restores the default now); Qwen Desk never changes this setting."
    )
    return Step(Remedy.WIRED_LIMIT, text, context=context, kv_bits=est.kv_bits, command=command, wired_limit_mb=mb, leaves_bytes=leaves)


def _whole_with_kv_cache(model: ModelRef, est: estimate.Estimate, budget: int) -> str:
    """'; the whole 32,768 also fits with the KV cache quantized to 8 bits …' when a quantized cache holds it in `budget`."""
    for bits in (8, 4):
        if est.kv_bits is not None and bits >= est.kv_bits:
            continue
        if estimate.max_context(model, budget, bits) >= est.context:
            return f"; the whole {est.context:,} also fits with the KV cache quantized to {bits} bits: `--kv-bits {bits}`"
    return ""


def _shorter_context(est: estimate.Estimate) -> Step | None:
    if not est.max_context or est.max_context >= est.context:
        return None
    return Step(
        Remedy.SHORTER_CONTEXT,
        f"use a shorter context: up to {est.max_context:,} tokens fits (you asked for {est.context:,}).",
        context=est.max_context,
        kv_bits=est.kv_bits,
    )


def _kv_cache(model: ModelRef, est: estimate.Estimate, machine: MachineProfile) -> Step | None:
    for bits in (8, 4):
        if est.kv_bits is not None and bits >= est.kv_bits:
            continue
        other = estimate.estimate(model, est.context, machine, kv_bits=bits)
        if other.verdict != "too_big":
            return Step(
                Remedy.KV_CACHE,
                f"quantize the KV cache to {bits} bits (`--kv-bits {bits}`, or the KV cache menu): the whole "
                f"{est.context:,}-token context then fits ({_gb(other.total_bytes)} of {_gb(other.budget_bytes)}); a small quality cost.",
                context=est.context,
                kv_bits=bits,
            )
    return None


def _better_step_down(model: ModelRef, new: tuple[estimate.Estimate, ModelRef], old: tuple[estimate.Estimate, ModelRef]) -> bool:
    """The same model at fewer bits first (a smaller dense model is slower than a 4-bit MoE), then the biggest build."""
    same_new, same_old = new[1].name == model.name, old[1].name == model.name
    if same_new != same_old:
        return same_new
    return new[0].weights_bytes > old[0].weights_bytes


def _smaller_build(model: ModelRef, est: estimate.Estimate, machine: MachineProfile, candidates: Iterable[ModelRef]) -> Step | None:
    best: tuple[estimate.Estimate, ModelRef] | None = None
    for other in candidates:
        if (other.repo, other.local_path, other.bits) == (model.repo, model.local_path, model.bits):
            continue
        context = min(est.context, other.arch.max_position_embeddings)
        try:
            e = estimate.estimate(other, context, machine, kv_bits=est.kv_bits)
        except ValueError:
            continue
        if e.verdict != "too_big" and e.weights_bytes < est.weights_bytes and (best is None or _better_step_down(model, (e, other), best)):
            best = (e, other)
    if best is None:
        return None
    e, other = best
    return Step(
        Remedy.SMALLER_BUILD,
        f"choose the next build down that fits: {_build_name(other)} ({_gb(e.total_bytes)} at {e.context:,} tokens{', tight' if e.verdict == 'tight' else ''}"
        f"{f', ~{e.decode_tps_estimate:.0f} tok/s' if e.decode_tps_estimate else ''}).",
        context=e.context,
        kv_bits=est.kv_bits,
        model=_build_name(other),
        repo=other.repo,
    )


def _headline(model: ModelRef, est: estimate.Estimate) -> str:
    if est.verdict != "too_big":
        return ""
    if not est.max_context:
        return (
            f"No context fits: {_build_name(model)} needs {_gb(est.total_bytes - est.kv_cache_bytes)} before any KV cache "
            f"(weights {_gb(est.weights_bytes)}), more than this Mac's {_gb(est.budget_bytes)} GPU budget."
        )
    return f"{_build_name(model)} needs {_gb(est.total_bytes)} at {est.context:,} tokens, more than the {_gb(est.budget_bytes)} GPU budget."


def advise(model: ModelRef, est: estimate.Estimate, machine: MachineProfile, candidates: Iterable[ModelRef] = ()) -> Advice:
    """The ways out for `model` (estimated as `est` on `machine`), cheapest first; no steps when it fits or is tight.

    `candidates` are the other builds to look through for one that fits (the catalog, the library's rows)."""
    headline = _headline(model, est)
    if not headline:
        return Advice(est.verdict, "")
    steps = [
        _shorter_context(est),
        _kv_cache(model, est, machine),
        wired_limit_step(model, est, machine),
        _smaller_build(model, est, machine, candidates),
    ]
    found = tuple(step for step in steps if step is not None)
    if not found:
        headline += (
            f" Nothing fixes that on this Mac: even the most macOS can safely give the GPU ({_gb(max_safe_wired_limit(machine.memory_bytes))}) is not enough."
        )
    return Advice(est.verdict, headline, found)
