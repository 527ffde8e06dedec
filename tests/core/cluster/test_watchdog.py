"""Rank 0's bound on its waits for the other ranks: limits that follow the slowest model call so far."""

import time

from macapp.core.cluster.watchdog import FIRST_CALL_S, FLOOR_S, Watchdog


def test_limits_start_generous_and_follow_the_slowest_call():
    dog = Watchdog()
    assert dog.limit("call") == FIRST_CALL_S and dog.limit("header") == FLOOR_S
    with dog.waiting("call"):
        time.sleep(0.05)
    assert 0.05 <= dog.slowest_call_s < 1
    assert dog.limit("call") == FLOOR_S  # 10x a short call is under the floor
    dog.slowest_call_s = 30.0  # a large model's prefill chunk
    assert dog.limit("call") == dog.limit("header") == 300.0
    with dog.waiting("header"):  # a header's wait teaches nothing
        pass
    assert dog.slowest_call_s == 30.0


def test_a_fixed_limit_replaces_them():
    assert Watchdog(3).limit("call") == Watchdog(3).limit("header") == 3
