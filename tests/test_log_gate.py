"""runtime.log_gate: what clients choose is remembered and logged within bounds."""

from __future__ import annotations

from runtime.log_gate import LogGate, SeenOnce, shown


def test_seen_once_reports_each_key_once_and_stays_within_its_capacity():
    seen = SeenOnce(capacity=3)
    assert seen.new(["a", "b", "a"]) == ["a", "b"]
    assert seen.new(["a", "c", "d"]) == ["c", "d"]  # d is new but there is no room to remember it
    assert len(seen) == 3
    assert seen.new([f"x{i}" for i in range(10_000)])[:2] == ["x0", "x1"] and len(seen) == 3


def test_the_gate_lets_a_burst_through_then_counts_what_it_holds_back():
    gate = LogGate(burst=2, every_s=3600)
    assert [gate.allow()[0] for _ in range(5)] == [True, True, False, False, False]
    assert gate.held_back == 3
    gate._tokens = 1  # an hour later
    assert gate.allow() == (True, 3)


def test_a_long_key_is_cut_in_the_line():
    assert len(shown("k" * 10_000)) < 70
