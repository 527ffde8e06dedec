"""Throttle: the engine's and the downloads' real event records in, coalesced batches out."""

import threading

from macapp.core.download import events as download
from macapp.core.events import AnswerDelta, Failed, Finished, GenerationStats, ReasoningDelta, Reply, StatsUpdate
from macapp.ui.throttle import Throttle


def StatsAt(n: int) -> StatsUpdate:  # noqa: N802 - reads like the record it makes
    return StatsUpdate(GenerationStats(generation_tokens=n))


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
    th.offer(StatsAt(1))
    th.offer(StatsAt(2))
    for ch in "hello":
        th.offer(AnswerDelta(ch))
    batch = th.drain()
    assert batch == [ReasoningDelta("thin"), StatsAt(2), AnswerDelta("hello")]
    assert th.offered == 11 and th.drain(force=True) == []  # one batch held them all


def test_rate_limited_until_interval_passes():
    clock = FakeClock()
    th = Throttle(0.05, clock)
    th.offer(AnswerDelta("a"))
    assert th.drain() == [AnswerDelta("a")]
    th.offer(AnswerDelta("b"))
    clock.t = 0.01
    assert th.drain() == []
    clock.t = 0.06
    assert th.drain() == [AnswerDelta("b")]


def test_terminal_event_flushes_at_once():
    clock = FakeClock()
    th = Throttle(10.0, clock)
    th.offer(AnswerDelta("a"))
    th.drain()
    th.offer(AnswerDelta("b"))
    assert th.drain() == []
    assert th.offer(Finished(Reply(text="ab"))) is True
    assert th.drain() == [AnswerDelta("b"), Finished(Reply(text="ab"))]
    assert th.drain() == []


def test_no_text_lost_across_threads():
    th = Throttle(0.0)
    out: list[str] = []
    n = 5000

    def produce():
        for i in range(n):
            th.offer(AnswerDelta("x"))
        th.offer(Finished(Reply()))

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


def test_every_kind_of_terminal_event_flushes_and_is_never_merged():
    th = Throttle(10.0, FakeClock())
    th.offer(AnswerDelta("a"))
    th.drain()
    for terminal in (Failed("no"), download.DownloadStopped(bytes_kept=3), download.DownloadFailed(error=None)):
        assert th.offer(terminal) is True
    assert th.drain() == [Failed("no"), download.DownloadStopped(bytes_kept=3), download.DownloadFailed(error=None)]
    assert th.offer(download.Stalled(seconds=1.0)) is False and th.offer(download.Stalled(seconds=2.0)) is False
    assert th.drain(force=True) == [download.Stalled(seconds=2.0)]  # snapshots: only the latest of a run
