"""`qwen-desk fit` and `qwen-desk models`: the memory-fit check from the command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from typing import TypedDict

from macapp.cli import Subparsers, UsageError
from macapp.cli.cluster import VERDICT_WORDS, add_fit_arguments, check_fit_arguments, run_cluster_fit
from macapp.core import catalog, hardware, long_context
from macapp.core.download import downloaded_repos
from macapp.core.fit import advice, estimate, prefill_time
from macapp.core.fit.picture_cost import VisionCost
from macapp.core.hub.mtp import MtpStatus, status_for
from macapp.cli.fit_video import add_video_arguments, video_fit, video_words
from macapp.core.vision.builds import build_vision, downloaded_folder, refresh_catalog_and_pictures

DEFAULT_CONTEXT = estimate.DEFAULT_CONTEXT
IMAGES_WORDS = {True: "yes", False: "text only", None: "?"}


def register(subparsers: Subparsers) -> None:
    fit = subparsers.add_parser("fit", help="will a model fit this Mac (or another) at a context length?")
    fit.add_argument("model", help="catalog name (Qwen3.5-35B-A3B), hub repo id, or local folder")
    fit.add_argument("--bits", type=int, choices=(4, 8), help="MLX build (default 4 for catalog names)")
    _add_common(fit)
    fit.add_argument("--chip", help='what-if chip, e.g. "M3 Ultra" (default: this machine)')
    fit.add_argument("--memory", help="what-if RAM, e.g. 512GB (default: this machine)")
    fit.add_argument("--gpu-cores", type=int, help="GPU core count, for binned chips (M3 Max 30/40, M4 Max 32/40)")
    fit.add_argument(
        "--wired-limit",
        metavar="N[GB]",
        help="what if iogpu.wired_limit_mb were raised to N MB (or N GB): the GPU budget follows it; nothing is changed",
    )
    add_fit_arguments(fit)
    add_video_arguments(fit)
    fit.set_defaults(func=run_fit)

    models = subparsers.add_parser("models", help="the Qwen3.5 catalog with the fit verdict for this machine")
    _add_common(models)
    models.add_argument("--refresh", action="store_true", help="read each build's real config.json and exact file sizes from the hub first")
    models.set_defaults(func=run_models)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--context", type=parse_context, default=DEFAULT_CONTEXT, help=f"context length in tokens, e.g. 32768 or 128k (default {DEFAULT_CONTEXT})"
    )
    parser.add_argument("--kv-bits", type=int, choices=(4, 8), help="quantize the KV cache to 4 or 8 bits (default bf16)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--images", action="store_true", help="count pictures too: the vision tower and one picture at the processor's maximum")


def parse_context(text: str) -> int:
    """Tokens: `32768`, `128k` (k = 1,024, as context sizes are usually quoted) or `1m` (m = 1,000,000: the card's
    "about 1,010,000 with YaRN" is a decimal million, which 1,024 × 1,024 would overshoot)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM])?\s*", text or "")
    if not match or ("." in match.group(1) and not match.group(2)):
        raise argparse.ArgumentTypeError(f"context {text!r} is not a number of tokens (e.g. 32768, 128k or 1m)")
    unit = {None: 1, "k": 1024, "m": 1_000_000}[(match.group(2) or "").lower() or None]
    return int(float(match.group(1)) * unit)


NO_RAM_LIMIT = 1 << 62  # checks a --wired-limit's own value only, before the Mac it is compared with is known


def machine_from_args(args: argparse.Namespace) -> hardware.MachineProfile:
    """This Mac or the what-if one (--chip/--memory/--gpu-cores), with the --wired-limit what-if applied."""
    machine = _base_machine(args)
    limit = getattr(args, "wired_limit", None)
    if limit is None:
        return machine
    try:
        if not machine.is_apple_silicon:
            hardware.parse_wired_limit(limit, NO_RAM_LIMIT)  # a value that cannot be read is named first
            raise UsageError('--wired-limit is a macOS setting: give --chip too (e.g. --chip "M4 Pro") on this machine')
        return hardware.with_wired_limit(machine, hardware.parse_wired_limit(limit, machine.memory_bytes))
    except hardware.HardwareError as exc:
        raise UsageError(str(exc)) from None


def _base_machine(args: argparse.Namespace) -> hardware.MachineProfile:
    chip, memory, cores = getattr(args, "chip", None), getattr(args, "memory", None), getattr(args, "gpu_cores", None)
    if not (chip or memory or cores):
        return hardware.detect_machine()
    try:
        memory_bytes = hardware.parse_memory(memory) if memory else None
        if chip is None or memory_bytes is None:
            here = hardware.detect_machine(use_mlx=False)
            if chip is None and not here.is_apple_silicon:
                raise UsageError('this machine is not an Apple Silicon Mac: give --chip too (e.g. --chip "M4 Pro")')
            chip = chip or here.chip
            memory_bytes = memory_bytes or here.memory_bytes
        return hardware.what_if_machine(chip, memory_bytes, cores)
    except hardware.HardwareError as exc:
        raise UsageError(str(exc)) from None


def resolve(spec: str, bits: int | None) -> catalog.ModelRef:
    try:
        return catalog.resolve_model(spec, bits)
    except (catalog.UnknownModel, catalog.ConfigError) as exc:
        raise UsageError(str(exc)) from None


def run_fit(args: argparse.Namespace) -> int:
    model = resolve(args.model, args.bits)
    machine = machine_from_args(args)
    warning = hardware.machine_warning(machine)
    if warning:
        print(f"qwen-desk: warning: {warning}", file=sys.stderr)  # a warning, not a refusal: what-ifs stay possible
    check_fit_arguments(args)
    if args.hosts is not None:
        return run_cluster_fit(args, model, machine)
    seen = vision_args(model, args.images or args.video_frames is not None)
    seen["vision"], video, frames_fit = video_fit(args, model, seen["vision"])
    try:
        result = estimate.estimate(model, args.context, machine, kv_bits=args.kv_bits, **seen, mtp=mtp_status(model))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    ways_out = advice.advise(model, result, machine, catalog_refs())
    if args.json:
        extra = {"video": {**dataclasses.asdict(video), "frames_that_fit": frames_fit}} if video else {}
        print(json.dumps({**result.to_json(), "advice": ways_out.to_json(), **extra}, indent=2))
    else:
        print(describe(result, machine))
        if video is not None:
            print(f"  {video_words(video, frames_fit, args.context)}")
        for line in ways_out.lines():
            print(f"  {line}")
    return 0


class VisionArgs(TypedDict):
    """estimate.estimate's picture arguments."""

    vision: VisionCost | None
    accepts_images: bool | None
    images: bool


def vision_args(model: catalog.ModelRef, images: bool) -> VisionArgs:
    """What estimate.estimate needs to count (or just report) a build's pictures."""
    seen = build_vision(model)
    return {"vision": seen.cost, "accepts_images": seen.accepts_images, "images": images}


def mtp_status(model: catalog.ModelRef) -> MtpStatus:
    """Where the build's MTP head comes from, from this machine's files and cached hub records (no network)."""
    return status_for(model.repo, model.local_path or downloaded_folder(model.repo))


def catalog_refs() -> list[catalog.ModelRef]:
    """Every catalog build, for the advice's "next build down that fits"."""
    return [catalog.model_ref(entry, entry.build(bits)) for entry in catalog.load_catalog() for bits in sorted(entry.builds)]


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def describe(e: estimate.Estimate, machine: hardware.MachineProfile) -> str:
    """The short human breakdown."""
    bits = f"{e.bits}-bit" if e.bits else "bf16"
    kv = "bf16" if e.kv_bits is None else f"{e.kv_bits}-bit"
    lines = [
        f"{e.model} ({bits}{', ' + e.repo if e.repo else ''}) at {e.context:,} tokens on {machine.chip}, {machine.memory_bytes / 1024**3:.0f} GB",
        f"  weights        {_gb(e.weights_bytes):>10}{'' if e.weights_exact else '  (computed)'}",
        f"  KV cache       {_gb(e.kv_cache_bytes):>10}  ({kv}; full-attention layers only, {_gb(e.kv_cache_all_layers_bytes)} if every layer cached)",
        f"  DeltaNet state {_gb(e.state_bytes):>10}  (fixed)",
        f"  overhead       {_gb(e.overhead_bytes):>10}  (prefill chunk + runtime)",
        f"  total          {_gb(e.total_bytes):>10}  of a {_gb(e.budget_bytes)} GPU budget → {VERDICT_WORDS[e.verdict].upper()}",
        f"  largest context that fits: {e.max_context:,} tokens{sessions_words(e)}" if e.max_context else "  no context fits (ways out below)",
    ]
    if e.yarn_factor:
        lines.insert(1, f"  {long_context.notice(e.yarn_factor)} ({e.native_context:,} native)")
    if machine.budget_source == "wired-limit":
        lines.append(f"  (budget from iogpu.wired_limit_mb={e.budget_bytes // 1024**2}: leaves {_gb(machine.memory_bytes - e.budget_bytes)} for macOS)")
    if e.decode_tps_estimate is not None:
        lines.append(f"  speed (estimate): ~{e.decode_tps_estimate:.0f} tok/s early in a chat, ~{e.decode_tps_at_context:.0f} tok/s with the context full")
        lines.append(f"  {reading_words(e)}")
    else:
        lines.append("  speed: no estimate (not an Apple Silicon Mac)")
    lines.append(f"  {images_words(e)}")
    if e.mtp_where in ("in_build", "fetched", "to_fetch"):  # "none" and "not known yet" are in --json and the derivation
        lines += [f"  {line}" for line in e.derivation if line.startswith("MTP head")]
    return "\n".join(lines)


def images_words(e: estimate.Estimate) -> str:
    if e.accepts_images is False:
        return "images: this build is text-only"
    if not e.vision_bytes and e.accepts_images:
        return "images: yes, but the vision tower's size is not known until its files are read (`qwen-desk models --refresh`): not counted"
    if not e.vision_bytes:
        return "images: not known for this build until its files are read (`qwen-desk models --refresh`)"
    counted = "counted in the total" if e.images else "not counted (add --images)"
    maybe = "" if e.accepts_images else " (if this build carries its tower)"
    return f"images{maybe}: vision tower {_gb(e.vision_bytes)} + one picture at full size {_gb(e.image_activation_bytes or 0)}, {counted}"


def sessions_words(e: estimate.Estimate) -> str:
    """How many agent sessions `qwen-desk serve` answers at once at this context (its batch limit)."""
    if e.parallel_sessions < 2:
        return ""
    return f"; {e.parallel_sessions:,} agent sessions at once at {e.context:,} tokens each (qwen-desk serve)"


def reading_words(e: estimate.Estimate) -> str:
    """'reading a 20,000-token prompt: ~12 s (~1,650 tok/s)' — the time to first token for a full `--context` prompt."""
    if e.ttft_estimate_s is None:
        return "reading a prompt: no estimate (not an Apple Silicon Mac)"
    return f"reading a {e.context:,}-token prompt: ~{prefill_time.format_duration(e.ttft_estimate_s)} (estimate, ~{e.prefill_tps_estimate:,.0f} tok/s)"


def run_models(args: argparse.Namespace) -> int:
    if args.refresh:
        errors = refresh_catalog_and_pictures()
        for repo, error in errors.items():
            print(f"qwen-desk: could not refresh {repo}: {error} (using built-in data)", file=sys.stderr)
    entries = catalog.load_catalog()
    longest = max(e.arch.max_position_embeddings for e in entries)
    if not 1 <= args.context <= longest:
        raise UsageError(f"context must be between 1 and {longest:,} tokens (the family's maximum), not {args.context:,}")
    machine = hardware.detect_machine()
    downloaded = {repo.lower() for repo in downloaded_repos()}
    refs = [catalog.resolve_model(entry.build(bits).repo) for entry in entries for bits in sorted(entry.builds)]
    rows: list[dict[str, object]] = []
    shown: list[tuple[estimate.Estimate, bool]] = []
    for model in refs:
        # A model with a shorter maximum is judged at its maximum (the row says which context it used).
        context = min(args.context, model.arch.max_position_embeddings)
        e = estimate.estimate(model, context, machine, kv_bits=args.kv_bits, **vision_args(model, args.images), mtp=mtp_status(model))
        row = e.to_json()
        row["downloaded"] = is_downloaded = (model.repo or "").lower() in downloaded
        row["advice"] = advice.advise(model, e, machine, refs).to_json()
        rows.append(row)
        shown.append((e, is_downloaded))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{machine.chip}, {machine.memory_bytes / 1024**3:.0f} GB RAM, GPU budget {_gb(machine.budget_bytes)}; context {args.context:,} tokens")
    print(
        f"{'model':<20} {'bits':>4} {'weights':>9} {'total':>9} {'verdict':<8} {'tok/s':>6} {'read prompt':>12} {'max context':>12} {'images':<9}  downloaded"
    )
    for e, is_downloaded in shown:  # the table reads the estimates the JSON rows were made from
        tps = f"{e.decode_tps_estimate:.0f}" if e.decode_tps_estimate else "—"
        ttft = prefill_time.format_duration(e.ttft_estimate_s) if e.ttft_estimate_s is not None else "—"
        print(
            f"{e.model:<20} {e.bits:>4} {_gb(e.weights_bytes):>9} {_gb(e.total_bytes):>9} "
            f"{VERDICT_WORDS[e.verdict]:<8} {tps:>6} {ttft:>12} {e.max_context:>12,} {IMAGES_WORDS[e.accepts_images]:<9}  {'yes' if is_downloaded else ''}"
        )
    print(f"read prompt: the estimated time to read a {args.context:,}-token prompt before the first word of the answer")
    factors = {e.yarn_factor for e, _ in shown if e.yarn_factor}
    if factors:
        print(f"{long_context.notice(max(factors))} (past the native {min(e.native_context for e, _ in shown):,} tokens)")
    _print_wired_limit_notes(rows)
    return 0


def _print_wired_limit_notes(rows: list[dict[str, object]]) -> None:
    """Too-big builds that a raised iogpu.wired_limit_mb would let in, with the exact command (the fit command has the rest).
    `rows` are `qwen-desk models --json`'s: an estimate's JSON with its advice's under "advice"."""
    notes = []
    for r in rows:
        ways_out = r["advice"]
        steps = ways_out["steps"] if isinstance(ways_out, dict) else []
        for step in steps:
            if step["remedy"] == advice.Remedy.WIRED_LIMIT.value:
                shorter = f"up to {step['context']:,} tokens, " if step["context"] != r["context"] else ""
                notes.append(f"  {r['model']} {r['bits']}-bit: `{step['command']}` ({shorter}leaves {_gb(step['leaves_bytes'])} for macOS)")
    if notes:
        print("Too big for the default GPU limit, but would fit if macOS wired more memory for the GPU:")
        print("\n".join(notes))
        print("  The setting resets at reboot; if macOS and your apps need more than it leaves, the Mac swaps hard or freezes.")
        print("  Qwen Desk never changes it. `qwen-desk fit MODEL` lists every way out for a build.")
