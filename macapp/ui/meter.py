"""The live meter under the conversation: reading progress, then generation figures; and the per-message summary."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QWidget

from macapp.core.events import Event, GenerationStats, PromptProgress, StatsUpdate
from macapp.core.history import ReplyStats
from macapp.core.memory import format_bytes


def stats_summary(stats: GenerationStats | ReplyStats | None) -> str:
    """'128 tokens · 41.2 tok/s · prompt 412 tokens at 1830 tok/s · first token 0.21 s · peak 1.3 GB'.

    Takes the engine's GenerationStats or the history's ReplyStats (None where unknown). Generation tok/s
    excludes the time to first token (the engine's figure); prompt tok/s is the reading speed.
    """
    if stats is None:
        return ""
    parts = []
    tokens = stats.generation_tokens
    prompt_tokens = stats.prompt_tokens
    if tokens is not None:
        parts.append(f"{tokens:,} token{'' if tokens == 1 else 's'}")
    if stats.generation_tps:
        parts.append(f"{stats.generation_tps:.1f} tok/s")
    if isinstance(stats, GenerationStats) and stats.mtp_steps:  # speculative decoding with the MTP head ran (engine.mtp_decode)
        parts.append(f"MTP {stats.mtp_acceptance:.0%} accepted, {stats.mtp_tokens_per_step:.1f}/step")
    if stats.prompt_tps:
        label = f"prompt {prompt_tokens:,} tokens at " if prompt_tokens else "prompt at "
        pictures = getattr(stats, "image_tokens", None)
        label = label.replace(" tokens at ", f" tokens ({pictures:,} image) at ") if pictures else label
        parts.append(f"{label}{stats.prompt_tps:.0f} tok/s")
    if stats.ttft_s is not None:
        parts.append(f"first token {stats.ttft_s:.2f} s")
    if stats.peak_memory_bytes:
        parts.append(f"peak {format_bytes(stats.peak_memory_bytes)}")
    return " · ".join(parts)


class Meter(QLabel):
    """One line of figures while generating; says 'reading… 45%' while the prompt is being processed."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Meter")
        self.clear_meter()

    def clear_meter(self) -> None:
        self.setText(" ")

    def show_events(self, batch: list[Event]) -> None:
        """The latest reading progress or generation figures of a batch of the reply's events."""
        for event in batch:
            match event:
                case PromptProgress(processed=processed, total=total):
                    self.show_progress(processed, total)
                case StatsUpdate(stats=stats):
                    self.show_stats(stats)

    def show_progress(self, processed: int, total: int) -> None:
        pct = int(100 * processed / total) if total else 0
        self.setText(f"reading… {pct}%  ({processed:,} of {total:,} tokens)")

    def show_stats(self, stats: GenerationStats) -> None:
        self.setText(f"Generating · {stats_summary(stats)}")

    def show_context(self, stats: GenerationStats, limit: int | None) -> None:
        """Between replies: how much of the context the conversation uses."""
        used = getattr(stats, "context_tokens", None)
        if not used:
            self.clear_meter()
            return
        of = f" of {limit:,}" if limit else ""
        self.setText(f"Conversation: {used:,}{of} tokens of context in use")

    def show_text(self, text: str) -> None:
        self.setText(text)
