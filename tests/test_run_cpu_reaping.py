"""``harness.collectors.run_processes.run_cpu`` across a child's exit: what the run's
processes used per call stays exact when a child of the run is reaped between the reads
of its parent and of itself (the parent read first, its counter not yet holding the
child; the child then gone). Driven with fixed /proc figures, one call per tick."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from harness.collectors import run_processes

PARENT, CHILD = 100, 200


def _ticks(monkeypatch: pytest.MonkeyPatch, stats: Mapping[int, tuple[int, int, int, int]]):
    monkeypatch.setattr(run_processes, "read_run_stat", lambda pid: stats.get(pid))


def test_a_child_reaped_between_the_two_reads_is_never_negative_nor_counted_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pids = [PARENT, CHILD]
    # tick 0: the parent (own 100 ticks) and its busy child (400)
    _ticks(monkeypatch, {PARENT: (1, 100, 0, 1), CHILD: (5, 400, 0, PARENT)})
    _, _, prev = run_processes.run_cpu(pids, {})
    # tick 1: the parent read before it reaped the child (its counter still 0), then the
    # child read after: gone. Meanwhile the parent used 10 ticks, the child 50 more.
    _ticks(monkeypatch, {PARENT: (1, 110, 0, 1)})
    total1, on1, prev = run_processes.run_cpu(pids, prev)
    # tick 2: the parent's counter now holds the child's whole life (450)
    _ticks(monkeypatch, {PARENT: (1, 120, 450, 1)})
    total2, on2, _ = run_processes.run_cpu(pids, prev)
    assert total1 == on1 == 10  # the parent's own; nothing taken back yet
    assert total2 == on2 == 10 + 50  # the parent's own, and the child's last 50
    assert total1 + total2 == (120 - 100) + (450 - 400)  # every tick once


def test_a_child_reaped_before_both_reads_is_matched_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pids = [PARENT, CHILD]
    _ticks(monkeypatch, {PARENT: (1, 100, 0, 1), CHILD: (5, 400, 0, PARENT)})
    _, _, prev = run_processes.run_cpu(pids, {})
    _ticks(monkeypatch, {PARENT: (1, 110, 450, 1)})  # reaped before this call's reads
    total, on, now = run_processes.run_cpu(pids, prev)
    assert total == on == 10 + 50 and (CHILD, 5) not in now
