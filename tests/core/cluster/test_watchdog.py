"""Rank 0's bound on its waits for the other ranks: limits that follow the slowest model call so far."""

import time

from macapp.core.cluster.watchdog import FILES_S, FIRST_CALL_S, FLOOR_S, LOAD_S, Wait, Watchdog


def test_limits_start_generous_and_follow_the_slowest_call():
    dog = Watchdog()
    assert dog.limit(Wait.CALL) == FIRST_CALL_S and dog.limit(Wait.HEADER) == FLOOR_S
    with dog.waiting(Wait.CALL):
        time.sleep(0.05)
    assert 0.05 <= dog.slowest_call_s < 1
    assert dog.limit(Wait.CALL) == FLOOR_S  # 10x a short call is under the floor
    dog.slowest_call_s = 30.0  # a large model's prefill chunk
    assert dog.limit(Wait.CALL) == dog.limit(Wait.HEADER) == 300.0
    with dog.waiting(Wait.HEADER):  # a header's wait teaches nothing
        pass
    assert dog.slowest_call_s == 30.0


def test_a_fixed_limit_replaces_them():
    assert Watchdog(3).limit(Wait.CALL) == Watchdog(3).limit(Wait.HEADER) == 3


def test_loading_has_limits_of_its_own_that_calls_do_not_change():
    dog = Watchdog(3)
    assert dog.limit(Wait.FILES) == FILES_S and dog.limit(Wait.LOAD) == LOAD_S
    dog.slowest_call_s = 1000.0
    assert dog.limit(Wait.LOAD) == LOAD_S
    fixed = Watchdog(load_limit_s=5)
    assert fixed.limit(Wait.FILES) == fixed.limit(Wait.LOAD) == 5 and fixed.limit(Wait.CALL) == FIRST_CALL_S
