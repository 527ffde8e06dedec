"""The live meter under the conversation: reading progress, then generation figures; and the per-message summary."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QLabel, QWidget

from macapp.core.memory import format_bytes


def _get(stats: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(stats, name, None)
        if value is not None:
            return value
    return default


def stats_summary(stats: Any, live: bool = False) -> str:
    """'128 tokens · 41.2 tok/s · prompt 412 tokens at 1830 tok/s · first token 0.21 s · peak 1.3 GB'.

    Generation tok/s excludes the time to first token (the engine's figure); prompt tok/s is the reading speed.
    """
    if stats is None:
        return ""
    parts = []
    tokens = _get(stats, "generation_tokens", "tokens")
    gen_tps = _get(stats, "generation_tps", "decode_tps")
    prompt_tokens = _get(stats, "prompt_tokens")
    prompt_tps = _get(stats, "prompt_tps", "prefill_tps")
    ttft = _get(stats, "ttft_s", "ttft", "time_to_first_token")
    mem = _get(stats, "peak_memory_bytes", "memory_bytes")
    if mem is None:
        gb = _get(stats, "peak_memory", "peak_memory_gb")
        mem = gb * 1e9 if gb is not None else None
    if tokens is not None:
        parts.append(f"{tokens:,} token{'' if tokens == 1 else 's'}")
    if gen_tps:
        parts.append(f"{gen_tps:.1f} tok/s")
    if prompt_tps:
        label = f"prompt {prompt_tokens:,} tokens at " if prompt_tokens else "prompt at "
        parts.append(f"{label}{prompt_tps:.0f} tok/s")
    if ttft is not None:
        parts.append(f"first token {ttft:.2f} s")
    if mem:
        parts.append(f"peak {format_bytes(mem)}")
    return " · ".join(parts)


class Meter(QLabel):
    """One line of figures while generating; says 'reading… 45%' while the prompt is being processed."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Meter")
        self.updates = 0
        self.clear_meter()

    def clear_meter(self) -> None:
        self.setText(" ")

    def show_progress(self, processed: int, total: int) -> None:
        self.updates += 1
        pct = int(100 * processed / total) if total else 0
        self.setText(f"reading… {pct}%  ({processed:,} of {total:,} tokens)")

    def show_stats(self, stats: Any) -> None:
        self.updates += 1
        self.setText(f"Generating · {stats_summary(stats, live=True)}")

    def show_context(self, stats: Any, limit: int | None) -> None:
        """Between replies: how much of the context the conversation uses."""
        used = _get(stats, "context_tokens")
        if not used:
            self.clear_meter()
            return
        of = f" of {limit:,}" if limit else ""
        self.setText(f"Conversation: {used:,}{of} tokens of context in use")

    def show_text(self, text: str) -> None:
        self.setText(text)
