"""The meter's line shows the MTP figures when speculative decoding ran, and nothing new when it did not."""

from __future__ import annotations

from macapp.core.events import GenerationStats
from macapp.ui.meter import stats_summary


def test_the_mtp_figures_appear_only_when_mtp_ran():
    plain = GenerationStats(generation_tokens=40, generation_tps=20.0, ttft_s=0.1)
    assert "MTP" not in stats_summary(plain)
    fast = GenerationStats(
        generation_tokens=40, generation_tps=31.0, ttft_s=0.1, mtp_steps=12, mtp_drafted=30, mtp_accepted=27, mtp_acceptance=0.9, mtp_tokens_per_step=3.25
    )
    line = stats_summary(fast)
    assert "31.0 tok/s · MTP 90% accepted, 3.2/step" in line
