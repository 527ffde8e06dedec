"""The draft depth and "auto" (mtp_policy.py): decided from measured acceptance and times."""

from __future__ import annotations

import pytest

from macapp.core.engine.mtp_policy import DRIFT_DRAFTS, MAX_DEPTH, MIN_ROUNDS, PLAIN_PROBES, DepthPolicy, MTPCounts, Verdict
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
    # the same acceptance and verify passes (a verdict's: `measured` rounds the kept drafts per depth, which gives
    # the two different acceptance estimates), drafts eight times dearer
    cheap, dear = DepthPolicy(MTPMode.AUTO), DepthPolicy(MTPMode.AUTO)
    cheap.follow(pays(acceptance=0.8, draft_s=0.0005, verify_s={2: 0.011, 3: 0.012, 4: 0.013}))
    dear.follow(pays(acceptance=0.8, draft_s=0.004, verify_s={2: 0.011, 3: 0.012, 4: 0.013}))
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


def pays(**changes) -> Verdict:
    """A calibrated verdict where MTP pays: a verify pass costs about a plain step, a draft a tenth of one."""
    figures = dict(drafts=True, acceptance=1.0, looked=30, plain_s=0.01, draft_s=0.001, verify_s={2: 0.01, 3: 0.011, 4: 0.012}, reread_s=0.01)
    return Verdict(**{**figures, **changes})


def test_a_verdict_that_pays_drafts_from_the_first_step_and_one_that_does_not_is_off_from_the_start():
    drafting = DepthPolicy(MTPMode.AUTO)
    drafting.follow(pays())
    assert not drafting.wants_plain_probe() and drafting.depth(10) >= 2 and not drafting.off
    plain = DepthPolicy(MTPMode.AUTO)
    plain.follow(pays(drafts=False, acceptance=0.0, reason="calibrated: no"))
    assert plain.off and plain.off_reason == "calibrated: no" and plain.depth(10) == 0 and plain.plain_steps == 0


def test_following_the_same_verdict_again_keeps_what_the_conversation_measured():
    verdict = pays()
    policy = DepthPolicy(MTPMode.AUTO)
    policy.follow(verdict)
    policy.round(depth=2, looked=2, kept=2, draft_s=0.002, verify_s=0.011, reread_s=None)
    policy.follow(verdict)
    assert policy.rounds == 1 and policy.kept == 2
    policy.follow(pays())  # another verdict (the build was loaded again): from it
    assert policy.rounds == 0 and policy.kept == 0


def test_a_verdict_drafts_only_with_a_margin_over_plain_decoding():
    policy = DepthPolicy(MTPMode.AUTO)
    policy.follow(pays())
    assert policy.verdict(1.0, 30, "x").drafts
    assert not policy.verdict(0.0, 30, "x").drafts
    dear = DepthPolicy(MTPMode.AUTO)  # a verify pass of two tokens costs what two plain steps do: never worth it
    dear.follow(pays(verify_s={2: 0.02, 3: 0.03, 4: 0.04}, draft_s=0.0001))
    assert not dear.verdict(1.0, 30, "x").drafts and "tok/s" in dear.verdict(1.0, 30, "x").reason


def test_an_acceptance_that_drifts_in_use_decides_the_verdict_again_and_saves_it():
    verdict = pays()
    saved: list[Verdict] = []
    verdict.saved = saved.append
    policy = DepthPolicy(MTPMode.AUTO)
    policy.follow(verdict)
    while policy.looked < DRIFT_DRAFTS:
        k = policy.depth(10)
        assert k >= 1  # drafting on the verdict's word until use says otherwise
        policy.round(depth=k, looked=1, kept=0, draft_s=k * 0.001, verify_s=0.01, reread_s=0.01)
    assert saved == [verdict] and not verdict.drafts and verdict.acceptance == 0.0 and "in use" in verdict.reason
    assert policy.prior_looked == 0 and policy.depth(10) == 0 and policy.off  # from here, what use measured


def test_an_acceptance_in_use_near_the_verdicts_changes_nothing():
    verdict = pays(acceptance=0.8)
    verdict.saved = lambda v: pytest.fail("saved without a drift")
    policy = DepthPolicy(MTPMode.AUTO)
    policy.follow(verdict)
    for _ in range(2 * DRIFT_DRAFTS):
        policy.round(depth=5, looked=5, kept=4, draft_s=0.005, verify_s=0.012, reread_s=0.01)
    assert verdict.drafts and verdict.acceptance == 0.8 and policy.prior_looked > 0


def test_slow_passes_in_use_do_not_turn_a_calibrated_conversation_off_nor_change_the_verdict():
    verdict = pays()
    verdict.saved = lambda v: pytest.fail("a slow moment is not a drift")
    policy = DepthPolicy(MTPMode.AUTO)
    policy.follow(verdict)
    for _ in range(20):  # every draft kept, but each verify pass (a busy moment) costs ten plain steps
        k = policy.depth(10)
        assert k >= 2
        policy.round(depth=k, looked=k, kept=k, draft_s=k * 0.001, verify_s=0.1, reread_s=None)
    assert not policy.off and verdict.drafts and verdict.acceptance == 1.0 and policy.verify_s == verdict.verify_s
