"""One turn's clock: the only place a reply's GenerationStats are filled, live (StatsUpdate) and final alike."""

from __future__ import annotations

import time

from macapp.core.events import GenerationStats

STATS_INTERVAL_S = 0.25  # live StatsUpdate events come at most this often


class TurnClock:
    """The times of one turn, from the request (templating included) to its last token.

    Made when the request starts; `reading(n)` when its prompt (n tokens) starts being read; `first_token(t)`
    when the first token is sampled (the reply's bookkeeping calls it: reply.SequenceReply). `stats(...)` then turns counts into figures.
    """

    def __init__(self, start: float | None = None):
        self.start = time.perf_counter() if start is None else start
        self.prefill_start = self.start
        self.prompt_tokens = 0
        self.first_token_at = 0.0  # 0: no token yet
        self.image_tokens = 0  # of the prompt, the pictures' tokens (set when a turn has pictures)

    def reading(self, prompt_tokens: int) -> None:
        """The prompt starts being read now: the prefill is timed from here and MLX's peak memory restarts."""
        import mlx.core as mx

        mx.reset_peak_memory()
        self.prompt_tokens = prompt_tokens
        self.prefill_start = time.perf_counter()

    def first_token(self, now: float) -> None:
        self.first_token_at = now

    def stats(self, *, last_token_at: float, now: float, generated: int, reasoning: int, forced: int, context: int, finish: str | None) -> GenerationStats:
        """The figures so far: `generated` tokens, the last sampled at `last_token_at`; `finish` None while running."""
        import mlx.core as mx

        first = self.first_token_at
        return GenerationStats(
            ttft_s=first - self.start if first else 0.0,
            prompt_tokens=self.prompt_tokens if first else 0,
            prompt_tps=self.prompt_tokens / max(first - self.prefill_start, 1e-9) if first else 0.0,
            generation_tokens=generated,
            generation_tps=(generated - 1) / (last_token_at - first) if first and last_token_at > first else 0.0,
            reasoning_tokens=reasoning,
            forced_tokens=forced,
            peak_memory_bytes=int(mx.get_peak_memory()),
            context_tokens=context,
            elapsed_s=now - self.start,
            finish_reason=finish,
            image_tokens=self.image_tokens if first else 0,
        )

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def unanswered(self, context: int) -> GenerationStats:
        """A turn stopped before any token: nothing generated, `context` tokens left in the cache."""
        return GenerationStats(finish_reason="stopped", context_tokens=context, elapsed_s=self.elapsed())
