import threading
from dataclasses import dataclass

from macapp.ui.throttle import Throttle


@dataclass
class AnswerDelta:
    text: str


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class StatsUpdate:
    n: int


@dataclass
class Finished:
    reply: str


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_joins_text_and_keeps_latest_snapshot_in_order():
    clock = FakeClock()
    th = Throttle(0.05, clock)
    for ch in "thin":
        th.offer(ReasoningDelta(ch))
    th.offer(StatsUpdate(1))
    th.offer(StatsUpdate(2))
    for ch in "hello":
        th.offer(AnswerDelta(ch))
    batch = th.drain()
    assert batch == [ReasoningDelta("thin"), StatsUpdate(2), AnswerDelta("hello")]
    assert th.offered == 11 and th.batches == 1


def test_rate_limited_until_interval_passes():
    clock = FakeClock()
    th = Throttle(0.05, clock)
    th.offer(AnswerDelta("a"))
    assert th.drain() == [AnswerDelta("a")]
    th.offer(AnswerDelta("b"))
    clock.t = 0.01
    assert not th.due() and th.drain() == []
    clock.t = 0.06
    assert th.due() and th.drain() == [AnswerDelta("b")]


def test_terminal_event_flushes_at_once():
    clock = FakeClock()
    th = Throttle(10.0, clock)
    th.offer(AnswerDelta("a"))
    th.drain()
    th.offer(AnswerDelta("b"))
    assert th.drain() == []
    assert th.offer(Finished("ab")) is True
    assert th.drain() == [AnswerDelta("b"), Finished("ab")]
    assert th.drain() == []


def test_no_text_lost_across_threads():
    th = Throttle(0.0)
    out: list[str] = []
    n = 5000

    def produce():
        for i in range(n):
            th.offer(AnswerDelta("x"))
        th.offer(Finished(""))

    t = threading.Thread(target=produce)
    t.start()
    done = False
    while not done:
        for ev in th.drain():
            if isinstance(ev, AnswerDelta):
                out.append(ev.text)
            else:
                done = True
    t.join()
    assert "".join(out) == "x" * n
