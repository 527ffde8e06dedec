"""The draft depth and "auto" (mtp_policy.py): decided from measured acceptance and times."""

from __future__ import annotations

from macapp.core.engine.mtp_policy import MAX_DEPTH, MIN_ROUNDS, PLAIN_PROBES, DepthPolicy, MTPCounts
from macapp.core.engine.options import MTPMode


def measured(mode: MTPMode, *, plain: float, verify_per_token: float, draft: float, acceptance: float, rounds: int = 12) -> DepthPolicy:
    """A policy fed `rounds` rounds at the depth it asks for, each keeping drafts at the rate `acceptance`."""
    policy = DepthPolicy(mode)
    for _ in range(PLAIN_PROBES):
        policy.plain_step(plain)
    for _ in range(rounds):
        k = policy.depth(100)
        if k == 0:
            break
        kept = round(k * acceptance)
        looked = min(kept + 1, k)
        policy.round(depth=k, looked=looked, kept=kept, draft_s=k * draft, verify_s=plain + k * verify_per_token, reread_s=None if kept == k else plain)
    return policy


def test_auto_probes_plain_steps_first_then_drafts():
    policy = DepthPolicy(MTPMode.AUTO)
    assert policy.wants_plain_probe() and policy.depth(10) == 0 and not policy.off
    for _ in range(PLAIN_PROBES):
        policy.plain_step(0.01)
    assert policy.depth(10) >= 1
    assert DepthPolicy(MTPMode.ON).depth(10) >= 1  # "on" drafts from the first step


def test_a_head_that_is_always_right_drafts_deep_when_drafts_are_cheap():
    policy = measured(MTPMode.AUTO, plain=0.01, verify_per_token=0.001, draft=0.001, acceptance=1.0)
    assert not policy.off and policy.depth(100) >= 4 and policy.depth(100) <= MAX_DEPTH
    assert policy.depth(2) <= 2  # never more drafts than the reply has room for


def test_expensive_drafts_keep_the_depth_shallow():
    cheap = measured(MTPMode.AUTO, plain=0.01, verify_per_token=0.001, draft=0.0005, acceptance=0.8)
    dear = measured(MTPMode.AUTO, plain=0.01, verify_per_token=0.001, draft=0.004, acceptance=0.8)
    assert 1 <= dear.depth(100) < cheap.depth(100)


def test_auto_turns_off_a_head_that_does_not_pay_and_says_why():
    policy = measured(MTPMode.AUTO, plain=0.01, verify_per_token=0.002, draft=0.002, acceptance=0.0)
    assert policy.off and policy.rounds == MIN_ROUNDS and "acceptance" in policy.off_reason
    assert policy.depth(100) == 0  # for the rest of the conversation


def test_on_never_turns_off():
    policy = measured(MTPMode.ON, plain=0.01, verify_per_token=0.002, draft=0.002, acceptance=0.0)
    assert not policy.off and policy.depth(100) == 1


def test_counts_give_acceptance_and_tokens_per_step():
    counts = MTPCounts(steps=4, drafted=10, accepted=6, tokens=10)
    assert counts.acceptance_rate == 0.6 and counts.tokens_per_step == 2.5
    assert MTPCounts().acceptance_rate == 0.0 and MTPCounts().tokens_per_step == 0.0
