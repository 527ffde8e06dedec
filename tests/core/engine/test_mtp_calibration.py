"""MTP "auto" decided when the build loads (mtp_calibration.py): measured once per build and machine, remembered in
the app's cache folder, decided again when the acceptance in use drifts; replies stay the plain decode's."""

from __future__ import annotations

import json

import pytest

from macapp.core.engine import Engine, SessionOptions
from macapp.core.engine.mtp_calibration import verdicts_path
from macapp.core.engine.options import MTPMode
from macapp.core.sampling import greedy
from tests.core.engine.helpers import TIMEOUT


@pytest.fixture
def load(tiny_mtp):
    """`load(head)`: a new Engine with the tiny MoE model whose MTP head is `head`, loaded in "auto"."""
    engines: list[Engine] = []

    def make(head: str) -> Engine:
        e = Engine()
        engines.append(e)
        e.load(str(tiny_mtp("moe", head))).result(timeout=TIMEOUT)
        return e

    yield make
    for e in engines:
        e.close()


def banned(engine, n=40):
    vocab = engine.model.tokenizer.get_vocab()
    return greedy(n, logit_bias={vocab["<|im_end|>"]: -1e9, vocab["<|endoftext|>"]: -1e9})


def both(engine, text="Tell me about the sky.", n=40):
    """The same reply in "auto" and with MTP off: (auto's session, auto's reply, off's reply)."""
    auto, off = engine.new_session(), engine.new_session(options=SessionOptions(mtp=MTPMode.OFF))
    a = auto.send(text, sampling=banned(engine, n)).result(timeout=TIMEOUT)
    b = off.send(text, sampling=banned(engine, n)).result(timeout=TIMEOUT)
    assert (a.text, a.reasoning, a.token_ids) == (b.text, b.reasoning, b.token_ids)
    return auto, a, b


def entries():
    return json.loads(verdicts_path().read_text())["entries"]


# a verdict as measured where MTP pays (the timings of this shared machine say what they like: speed is bench/'s)
PAYS = dict(drafts=True, acceptance=1.0, looked=30, plain_s=0.02, draft_s=0.001, verify_s={"2": 0.02, "3": 0.021, "4": 0.022}, reread_s=0.02)


def rewrite(change):
    data = json.loads(verdicts_path().read_text())
    for entry in data["entries"]:
        change(entry)
    verdicts_path().write_text(json.dumps(data))


def test_a_useless_head_starts_plain_with_no_probe_steps(load):
    e = load("random")
    verdict = e.model.mtp_head.verdict
    assert verdict.origin == "measured" and not verdict.drafts and verdict.acceptance < 0.3 and verdict.looked >= 8
    again = load("random")  # the next load remembers it
    assert again.model.mtp_head.verdict.origin == "remembered"
    for engine in (e, again):
        auto, reply, _ = both(engine)
        policy = auto.mtp_policy
        assert reply.stats.mtp_steps == 0 and reply.stats.mtp_passes == 0
        assert policy.plain_steps == 0 and policy.rounds == 0 and policy.off
        assert auto._live.head is None  # the prompt was read without feeding the head


def test_an_always_right_head_drafts_from_the_first_step(load):
    measured = load("right").model.mtp_head.verdict
    assert measured.acceptance == 1.0 and measured.looked >= 24 and set(measured.verify_s) == {2, 3, 4}  # every draft kept
    rewrite(lambda entry: entry.update(PAYS))
    e = load("right")
    assert e.model.mtp_head.verdict.drafts
    auto, reply, _ = both(e, n=60)
    policy = auto.mtp_policy
    assert policy.plain_steps == 0 and policy.rounds > 0  # no plain probe: drafting from the start
    assert reply.stats.mtp_steps > 0 and reply.stats.mtp_accepted == reply.stats.mtp_drafted > 0


def test_the_verdict_is_remembered_per_build_and_machine(load):
    random = load("random").model.mtp_head.verdict
    remembered = load("random").model.mtp_head.verdict
    assert remembered.origin == "remembered"
    assert (remembered.drafts, remembered.acceptance, remembered.plain_s, remembered.verify_s) == (
        random.drafts,
        random.acceptance,
        random.plain_s,
        random.verify_s,
    )
    right = load("right").model.mtp_head.verdict  # another build: its own entry
    assert right.origin == "measured" and right.acceptance == 1.0
    assert len(entries()) == 2 and len({e["build"] for e in entries()}) == 2
    rewrite(lambda entry: entry.update(machine="another machine"))
    assert load("random").model.mtp_head.verdict.origin == "measured"  # not this machine's: measured here
    assert sorted(e["machine"] == "another machine" for e in entries()) == [False, True, True]  # the other machine's kept


def test_an_acceptance_that_drifts_in_use_decides_again(load):
    load("random")
    # as if the head had been right when the build was calibrated
    rewrite(lambda entry: entry.update(PAYS))
    e = load("random")
    verdict = e.model.mtp_head.verdict
    assert verdict.origin == "remembered" and verdict.drafts
    auto, reply, _ = both(e, n=80)
    assert reply.stats.mtp_steps > 0  # it believed the verdict, drafted, and measured the head in use
    assert not verdict.drafts and verdict.acceptance < 0.3 and "in use" in verdict.reason and auto.mtp_policy.off
    (entry,) = entries()
    assert entry["drafts"] is False and entry["acceptance"] < 0.3  # saved: the next load starts plain
    later = load("random")
    assert not later.model.mtp_head.verdict.drafts
    _, reply, _ = both(later)
    assert reply.stats.mtp_steps == 0


@pytest.mark.parametrize("damage", ["{not json", json.dumps({"version": 1, "entries": "none"}), "acceptance"])
def test_a_damaged_verdict_file_is_ignored(load, damage):
    load("random")
    if damage == "acceptance":  # one entry with a field of the wrong kind
        rewrite(lambda entry: entry.update(acceptance="high"))
    else:
        verdicts_path().write_text(damage)
    e = load("random")
    assert e.model.mtp_head.verdict.origin == "measured"
    (entry,) = entries()  # written over, whole again
    assert isinstance(entry["acceptance"], float) and entry["drafts"] is False
    _, reply, _ = both(e)
    assert reply.stats.mtp_steps == 0


def test_an_app_home_that_cannot_be_written_loses_only_the_memory_of_the_verdict(load, tmp_path, monkeypatch):
    blocked = tmp_path / "home-is-a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("QWEN_DESK_HOME", str(blocked))
    e = load("random")  # loads, calibrates, and cannot save: the next load measures again
    assert e.model.mtp_head.verdict.origin == "measured" and not e.model.mtp_head.verdict.drafts
    assert load("random").model.mtp_head.verdict.origin == "measured"
    _, reply, _ = both(e)
    assert reply.stats.mtp_steps == 0
