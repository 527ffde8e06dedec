"""How deep to draft, and whether drafting pays at all: chosen from what this conversation measured.

Like Ollama's MLX runner, the depth k maximises expected tokens per unit of time. With a per-draft acceptance
rate a (measured: kept drafts over drafts the walk looked at), a round of depth k yields
E(k) = (1 - a^(k+1)) / (1 - a) tokens and costs k drafts + one verify pass over k+1 tokens + (when a draft is
rejected, probability 1 - a^k) a re-read of the kept ones (the DeltaNet state cannot be rewound; see
mtp_decode). Plain decoding yields 1 token per plain step. Times are measured as the stream runs (plain
steps, verify passes by width, drafts, re-reads); until measured, a guess that leans towards trying MTP.

"auto" turns MTP off for the conversation once, after MIN_ROUNDS rounds, no depth beats a plain step; "on"
never turns it off (depth at least 1). Exactness never depends on any of this: only speed does.

With a Verdict (auto's calibration for this build on this machine, made when the build loads: mtp_calibration.py)
"auto" starts from it instead: plain from the first token when MTP does not pay (no probe steps, no rounds), else
drafting from the first step at the depth its timings and acceptance give. The acceptance measured in use is
watched: when it drifts from the verdict's, the verdict is decided again at the acceptance use measured (and
saved, so the next load starts from it). The verdict's timings stand for the whole conversation: they say what a
verify pass costs against a decode step on this machine, while timings taken in use swing with whatever else the
machine runs (a verify pass timed in a busy moment against a plain step timed in a quiet one turned MTP off).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field
from typing import Callable

from macapp.core.engine.options import MTPMode

MAX_DEPTH = 6
MIN_ROUNDS = 2  # rounds measured before "auto" may turn MTP off (more while every draft is kept)
EXPLORE_DEPTH = 3  # the deepest draft while exploring
PLAIN_PROBES = 3  # plain steps timed at the start of a conversation (the baseline MTP must beat)
_RECENT = 5  # timings are the median of the last few: one slow step (a new shape, a busy machine) is not the rule
PRIOR_DRAFTS = 16  # a verdict's acceptance counts as this many drafts in a conversation's estimate (in use soon outweighs it)
DRIFT_DRAFTS = 8  # drafts measured in use before their acceptance is compared with the verdict's
DRIFT = 0.25  # an acceptance in use this far from the verdict's: decide again
MARGIN = 1.05  # a verdict drafts only when MTP promises at least this much over plain decoding (noise must not cost)


class Timing:
    """The median of the last few measurements of one thing (None until measured)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    @classmethod
    def of(cls, seconds: float | None) -> "Timing":
        timing = cls()
        if seconds is not None:
            timing.add(seconds)
        return timing

    def add(self, seconds: float) -> None:
        self.values = [*self.values[-(_RECENT - 1) :], seconds]

    @property
    def value(self) -> float | None:
        if not self.values:
            return None
        ordered = sorted(self.values)
        return ordered[len(ordered) // 2]


@dataclass
class MTPCounts:
    """What MTP did in one reply (the figures in GenerationStats)."""

    steps: int = 0  # verify passes (each with at least one draft)
    drafted: int = 0  # drafted tokens the walk looked at
    accepted: int = 0  # of those, kept
    tokens: int = 0  # tokens the verify passes produced (kept drafts + the target's own token)
    passes: int = 0  # the main model's forward passes (verify, re-read, plain steps, and plain decoding after auto)

    def plus(self, other: "MTPCounts") -> "MTPCounts":
        return MTPCounts(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def minus(self, other: "MTPCounts") -> "MTPCounts":
        return MTPCounts(*(a - b for a, b in zip(astuple(self), astuple(other))))

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


@dataclass
class Verdict:
    """Whether MTP pays for one build on one machine, and the figures it was decided on (mtp_calibration measures,
    saves and reloads it; a conversation in "auto" starts from it: DepthPolicy.follow)."""

    drafts: bool
    acceptance: float  # per-draft acceptance: the calibration's, or what use measured when it drifted
    looked: int  # drafts that acceptance was measured on
    plain_s: float  # one plain step
    draft_s: float  # the head's work per drafted token
    verify_s: dict[int, float]  # one verify pass, by its width
    reread_s: float | None  # re-reading the kept tokens after a rejection (None: none was measured)
    reason: str = ""
    origin: str = "measured"  # "measured" at this load, or "remembered" from an earlier one
    saved: Callable[["Verdict"], None] | None = field(default=None, compare=False, repr=False)  # told when decided again

    def decide_again(self, policy: "DepthPolicy", acceptance: float, looked: int) -> None:
        """Drift: decide from `policy`'s timings (this verdict's) at the acceptance use measured; the new figures
        replace these and are saved."""
        decided = policy.verdict(acceptance, looked, f"acceptance in use {acceptance:.0%}, {self.acceptance:.0%} before")
        for name in ("drafts", "acceptance", "looked", "plain_s", "draft_s", "verify_s", "reread_s", "reason"):
            setattr(self, name, getattr(decided, name))
        if self.saved is not None:
            self.saved(self)


@dataclass
class DepthPolicy:
    """One conversation's measurements and decisions (a ChatSession keeps one across its turns)."""

    mode: MTPMode = MTPMode.AUTO
    off: bool = False  # auto found that MTP does not pay here: plain decoding for the rest of the conversation
    off_reason: str = ""
    plain: Timing = field(default_factory=Timing)  # one plain step
    draft: Timing = field(default_factory=Timing)  # one drafted token (the head's work per draft)
    verify: dict[int, Timing] = field(default_factory=dict)  # one verify pass, by its width (k+1)
    reread: Timing = field(default_factory=Timing)  # re-reading the kept tokens after a rejection
    looked: int = 0  # drafts the walk looked at (all replies)
    kept: int = 0
    rounds: int = 0
    plain_steps: int = 0
    streak: int = 0  # rounds in a row that kept every draft (exploration goes deeper while they do)
    calibrated: Verdict | None = None  # the verdict this conversation started from ("auto" only: follow)
    prior_looked: int = 0  # the verdict's acceptance, as drafts counted in the estimate
    prior_kept: int = 0

    @property
    def plain_s(self) -> float | None:
        return self.plain.value

    @property
    def verify_s(self) -> dict[int, float]:
        return {w: t.value for w, t in self.verify.items() if t.value is not None}

    @property
    def acceptance(self) -> float:
        """The per-draft acceptance estimate (Laplace: one kept and one rejected imagined, so it starts at 1/2)."""
        return (self.kept + self.prior_kept + 1) / (self.looked + self.prior_looked + 2)

    def wants_plain_probe(self) -> bool:
        """A plain step now, to time the baseline (auto without a verdict only: "on" drafts from the first step)."""
        return self.mode is MTPMode.AUTO and self.calibrated is None and self.plain_steps < PLAIN_PROBES

    def follow(self, verdict: Verdict) -> None:
        """Start from `verdict` ("auto"): its timings stand for the probes and the exploration (and for the rest of the
        conversation), its acceptance for the first drafts, and MTP is off from the first token when it says so.
        Once per verdict: the acceptance this conversation measured since stays."""
        if self.calibrated is verdict:
            return
        self.calibrated = verdict
        self.plain, self.draft, self.reread = Timing.of(verdict.plain_s), Timing.of(verdict.draft_s), Timing.of(verdict.reread_s)
        self.verify = {width: Timing.of(seconds) for width, seconds in verdict.verify_s.items()}
        self.looked = self.kept = self.rounds = self.plain_steps = self.streak = 0
        self.prior_looked = min(verdict.looked, PRIOR_DRAFTS)
        self.prior_kept = round(verdict.acceptance * self.prior_looked)
        self.off, self.off_reason = not verdict.drafts, verdict.reason

    def verdict(self, acceptance: float, looked: int, why: str) -> Verdict:
        """The verdict these timings give at `acceptance` (measured on `looked` drafts): MTP drafts when its best
        depth promises at least MARGIN times plain decoding's speed."""
        best, rate = self._best(MAX_DEPTH, acceptance)
        plain = 1 / self._plain()
        drafts = best > 0 and rate >= MARGIN * plain
        reread = self.reread.value
        return Verdict(
            drafts=drafts,
            acceptance=acceptance,
            looked=looked,
            plain_s=self._plain(),
            draft_s=self._draft(),
            verify_s=self.verify_s,
            reread_s=reread,
            reason=f"{why}: {rate:.1f} tok/s with MTP at best, {plain:.1f} plain",
        )

    def depth(self, most: int) -> int:
        """The depth for the next round (0: a plain step), at most `most` drafts."""
        if self.off or most <= 0 or self.wants_plain_probe():
            return 0
        most = min(most, MAX_DEPTH)
        best, _ = self._best(most, self.acceptance)
        if self.calibrated is None and self.rounds < MIN_ROUNDS + min(self.streak, EXPLORE_DEPTH + 1):
            # exploring: deeper while every draft is kept (up to EXPLORE_DEPTH), and longer, so that a head that is
            # right is judged on several timings of the same pass, not on one
            return min(max(best, 1 + min(self.streak, EXPLORE_DEPTH - 1)), most)
        if best > 0 or self.mode is MTPMode.ON:
            return max(best, 1)
        # Off only if MTP loses even at the hopeful end of what was measured (few rounds say little: a head
        # that kept every draft so far must not be turned off by one slow verify pass on a busy machine).
        hopeful, rate = self._best(most, (self.kept + self.prior_kept + 1) / (self.looked + self.prior_looked + 1))
        if hopeful > 0:
            return 1
        self.off = True
        self.off_reason = f"acceptance {self.acceptance:.0%}: {rate:.1f} tok/s with MTP at best, {1 / self._plain():.1f} plain"
        verdict = self.calibrated
        if verdict is not None and self.looked and abs(self.kept / self.looked - verdict.acceptance) > DRIFT:
            verdict.decide_again(self, self.kept / self.looked, self.looked)  # drifted, on fewer drafts than _watch_drift waits for
        return 0

    def _plain(self) -> float:
        return self.plain_s if self.plain_s is not None else min(self.verify_s.values(), default=1.0)

    def _draft(self) -> float:
        return self.draft.value if self.draft.value is not None else 0.1 * self._plain()

    def _verify(self, width: int) -> float:
        if width in self.verify_s:
            return self.verify_s[width]
        plain = self._plain()
        known = sorted(self.verify_s.items())
        if not known:
            return plain * (1 + 0.1 * (width - 1))  # a guess: a wider pass costs a little more
        w0, t0 = min(known, key=lambda kv: abs(kv[0] - width))
        if len(known) < 2:
            return max(t0 * (1 + 0.1 * (width - w0)), plain * 0.5)
        # the measured cost per token (a least-squares slope, never negative: a noisy timing must not make
        # a wider pass look cheaper), from the nearest measured width
        mean_w = sum(w for w, _ in known) / len(known)
        mean_t = sum(t for _, t in known) / len(known)
        slope = sum((w - mean_w) * (t - mean_t) for w, t in known) / sum((w - mean_w) ** 2 for w, _ in known)
        return max(t0 + max(slope, 0.0) * (width - w0), plain * 0.5)

    def _best(self, most: int, acceptance: float) -> tuple[int, float]:
        """(depth maximising expected tokens/s over 0..most at this per-draft acceptance, the best expected
        tokens/s of a depth >= 1)."""
        a = min(acceptance, 0.999)
        plain = self._plain()
        draft = self._draft()
        rates: dict[int, float] = {}
        for k in range(1, most + 1):
            tokens = (1 - a ** (k + 1)) / (1 - a)
            reread = self.reread.value if self.reread.value is not None else self._verify(max(1, round(tokens - 1)))
            rates[k] = tokens / (k * draft + self._verify(k + 1) + (1 - a**k) * reread)
        k_best = max(rates, key=lambda k: rates[k])
        return (k_best if rates[k_best] > 1 / plain else 0), rates[k_best]

    # -- measurements ----------------------------------------------------------------------------------
    def plain_step(self, seconds: float) -> None:
        self.plain_steps += 1
        if self.calibrated is None:
            self.plain.add(seconds)

    def round(self, *, depth: int, looked: int, kept: int, draft_s: float, verify_s: float, reread_s: float | None) -> None:
        self.rounds += 1
        self.looked += looked
        self.kept += kept
        self.streak = self.streak + 1 if kept == depth else 0
        if self.calibrated is not None:  # the verdict's timings stand (module docstring)
            self._watch_drift()
            return
        self.draft.add(draft_s / max(depth, 1))
        self.verify.setdefault(depth + 1, Timing()).add(verify_s)
        if reread_s is not None:
            self.reread.add(reread_s)

    def _watch_drift(self) -> None:
        """Once enough drafts were measured in use, compare their acceptance with the verdict's: far off, the verdict
        is decided again, and from here this conversation's estimate is what use measured."""
        verdict = self.calibrated
        if verdict is None or self.looked < DRIFT_DRAFTS:
            return
        measured = self.kept / self.looked
        if abs(measured - verdict.acceptance) > DRIFT:
            self.prior_looked = self.prior_kept = 0
            verdict.decide_again(self, measured, self.looked)
