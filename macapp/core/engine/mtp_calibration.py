"""Whether the MTP head pays for this build on this machine: measured once when the build loads, remembered after.

A short calibration (`measure`): the build reads a fixed prompt with the head's context, as a conversation does,
then decodes a few dozen tokens greedily, plain steps interleaved with drafting rounds of depth 1 to 3, through
mtp_decode's own Decoder, so every figure is timed where use times it: a plain step, a verify pass of each width,
the head's work per draft, a re-read after a rejection (each the fastest of its last few: what else the machine
runs only adds time), and the head's acceptance on those tokens. The verdict (mtp_policy.Verdict) is what
DepthPolicy's model of expected tokens per second says of those figures.

It is kept in a small JSON file in the app's cache folder (`VERDICTS_FILE`), one entry per build and machine: the
build by its folder and the size and time of its weight files (a new download or a fetched head is a new build),
the machine by its chip, memory, system and MLX version. A later load takes the entry instead of measuring again,
so a reply pays no probe; a damaged file or entry is ignored (measured again and written over). When the acceptance
measured in use drifts from the verdict's, the conversation decides again and the entry is rewritten
(DepthPolicy._watch_drift). Only speed depends on any of this: drafting is exact whatever the verdict.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from macapp.core import paths
from macapp.core.engine.mtp_decode import Decoder
from macapp.core.engine.mtp_policy import MAX_DEPTH, DepthPolicy, MTPCounts, Timing, Verdict
from macapp.core.engine.prefill import prefill, wired_memory
from macapp.core.engine.prompt_cache import PromptCache
from macapp.core.hardware import detect_machine
from macapp.core.jsonvalue import JSONObject
from macapp.core.sampling import greedy, make_sampler_and_processors

if TYPE_CHECKING:
    from macapp.core.engine.model_folder import LoadedModel

log = logging.getLogger(__name__)

VERDICTS_FILE = "mtp_verdicts.json"
VERSION = 1  # of the calibration: a new one measures every build again
PROMPT = "Explain how a hash map finds a key, then write a short Python function that counts the words in a text."
CYCLES = 4  # each: a plain step and a round at each depth of DEPTHS, interleaved so they see the same machine load
DEPTHS = (1, 2, 3)


@dataclass(frozen=True)
class Key:
    build: str  # the build's identity (build_identity)
    machine: str  # this machine's (machine_identity)


class _Scripted(DepthPolicy):
    """A policy whose depths are a fixed schedule (0: a plain step): the calibration's, timed as use times them."""

    def __init__(self, schedule: list[int]) -> None:
        super().__init__()
        self.schedule = list(schedule)

    def wants_plain_probe(self) -> bool:
        return False

    def depth(self, most: int) -> int:
        return min(self.schedule.pop(0), most, MAX_DEPTH) if self.schedule else 0


def calibrate(m: "LoadedModel") -> Verdict | None:
    """The build's verdict for "auto", set on its head: the one remembered for this build and machine, else measured
    now and saved. None (and no verdict: "auto" probes as it goes) when the build has no head or measuring failed."""
    head = m.mtp_head
    if head is None:
        return None
    try:
        key = Key(build_identity(m.path, head.source), machine_identity())
        verdict = find(key)
        if verdict is None:
            verdict = measure(m)
            save(key, verdict, m.path)
    except Exception:  # only speed depends on it: the build still loads, and "auto" measures in use
        log.exception("MTP calibration failed for %s", m.path)
        return None
    verdict.saved = lambda v: save(key, v, m.path)
    head.verdict = verdict
    return verdict


def measure(m: "LoadedModel") -> Verdict:
    """Time plain steps and drafting rounds on this machine and measure the head's acceptance (module docstring)."""
    head = m.mtp_head
    assert head is not None, "calibrate() measures only a build with a head"
    ids = list(m.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, enable_thinking=False))
    prompt = PromptCache.new(m)
    context = prompt.head_context(head)
    cycle = [step for depth in DEPTHS for step in (0, depth)]
    policy = _Scripted(cycle)  # a first cycle warms each shape up: its timings are dropped
    params = greedy((CYCLES + 1) * len(cycle) * (max(DEPTHS) + 1) + 1)
    sampler, processors = make_sampler_and_processors(params)
    with wired_memory(m):
        prefill(m, prompt.layers, ids[:-1], head=context)
        decoder = Decoder(m, head, prompt.layers, len(ids) - 1, params, sampler, processors, policy, MTPCounts(), context=context)
        decoder.gave(decoder.start(ids[-1:]))
        for timed in (False, True):
            if timed:
                policy.plain, policy.draft, policy.reread, policy.verify = Timing(), Timing(), Timing(), {}
                policy.schedule = cycle * CYCLES
            while policy.schedule:
                for token in decoder.round(params.max_tokens) or []:
                    decoder.gave(token)
    for timing in (policy.plain, policy.draft, policy.reread, *policy.verify.values()):
        timing.values = timing.values and [min(timing.values)]  # the machine's own cost: other work only adds to it
    looked = policy.looked
    acceptance = policy.kept / looked if looked else 0.0
    return policy.verdict(acceptance, looked, f"calibrated: acceptance {acceptance:.0%} on {looked} drafts")


# -- identities -------------------------------------------------------------------------------------------
def build_identity(folder: Path, head_file: Path) -> str:
    """The build: its folder, and the name, size and modification time of its config, weights and head files."""
    files = sorted({*Path(folder).glob("*.safetensors"), Path(folder) / "config.json", Path(head_file)})
    parts = [str(Path(folder).resolve())]
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


@functools.cache
def machine_identity() -> str:
    """This machine as far as speed goes: chip, memory and GPU cores, system, MLX version and device."""
    from importlib.metadata import version

    import mlx.core as mx

    profile = detect_machine(use_mlx=False)
    cores = f", {profile.gpu_cores} GPU cores" if profile.gpu_cores else ""
    memory = round(profile.memory_bytes / 1024**3)
    return f"{profile.chip}{cores}, {memory} GB, {platform.system()} {platform.machine()}, mlx {version('mlx')} {mx.default_device()}"


# -- the file ---------------------------------------------------------------------------------------------
def verdicts_path() -> Path:
    return paths.cache_dir() / VERDICTS_FILE


def _entries() -> list[JSONObject]:
    """The file's entries of this calibration version ([] for a missing or damaged file)."""
    try:
        data = json.loads(verdicts_path().read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("entries"), list):
        return []
    return [e for e in data["entries"] if isinstance(e, dict)]


def find(key: Key) -> Verdict | None:
    """The remembered verdict for `key`, or None (none, or its entry is damaged)."""
    for entry in _entries():
        if entry.get("build") == key.build and entry.get("machine") == key.machine:
            return _verdict_of(entry)
    return None


def save(key: Key, verdict: Verdict, folder: Path) -> None:
    """Write `verdict` as `key`'s entry (replacing an earlier one), keeping the others; never fails a load."""
    entry: JSONObject = {
        "build": key.build,
        "machine": key.machine,
        "model": str(folder),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "drafts": verdict.drafts,
        "acceptance": verdict.acceptance,
        "looked": verdict.looked,
        "plain_s": verdict.plain_s,
        "draft_s": verdict.draft_s,
        "verify_s": {str(width): seconds for width, seconds in sorted(verdict.verify_s.items())},
        "reread_s": verdict.reread_s,
        "reason": verdict.reason,
    }
    others = [e for e in _entries() if not (e.get("build") == key.build and e.get("machine") == key.machine) and _verdict_of(e) is not None]
    try:
        path = verdicts_path()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".mtp_verdicts-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"version": VERSION, "entries": [*others, entry]}, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        log.exception("could not save the MTP verdict in the app's cache folder")


def _verdict_of(entry: JSONObject) -> Verdict | None:
    """The Verdict an entry holds, or None when any of its fields is missing or of the wrong kind."""
    drafts, acceptance, looked = entry.get("drafts"), entry.get("acceptance"), entry.get("looked")
    plain, draft, verify, reread = entry.get("plain_s"), entry.get("draft_s"), entry.get("verify_s"), entry.get("reread_s")
    reason = entry.get("reason", "")
    if not isinstance(drafts, bool) or not _number(acceptance) or not isinstance(looked, int) or isinstance(looked, bool):
        return None
    if not (_seconds(plain) and _seconds(draft) and isinstance(verify, dict) and (reread is None or _seconds(reread))):
        return None
    if not isinstance(reason, str) or not all(k.isdigit() and _seconds(v) for k, v in verify.items()):
        return None
    assert isinstance(acceptance, (int, float)) and isinstance(plain, (int, float)) and isinstance(draft, (int, float))
    widths = {int(k): float(v) for k, v in verify.items() if isinstance(v, (int, float))}
    return Verdict(
        drafts=drafts,
        acceptance=float(acceptance),
        looked=looked,
        plain_s=float(plain),
        draft_s=float(draft),
        verify_s=widths,
        reread_s=float(reread) if isinstance(reread, (int, float)) else None,
        reason=reason,
        origin="remembered",
    )


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1


def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 3600
