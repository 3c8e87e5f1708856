"""Scheduling requests coalesce: a burst of submissions queues one request each, and a request made
before this process began a cycle is already served by that cycle; one made after never is."""

from __future__ import annotations

import time

import pytest

from apps.scheduling import adapter
from workers import tasks


@pytest.fixture
def cycles(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    began: list[float] = []
    monkeypatch.setattr(tasks, "timed_cycle", lambda: began.append(time.time()) or adapter.CycleResult())
    monkeypatch.setattr(tasks, "_cycle_began_at", 0.0)
    return began


def test_requests_made_before_a_cycle_began_are_served_by_it(cycles: list[float]) -> None:
    burst = [time.time() for _ in range(50)]  # fifty submissions, each asking for a cycle
    time.sleep(0.01)
    results = [tasks.schedule_cycle(requested_at) for requested_at in burst]
    assert len(cycles) == 1
    assert results[0] != {"coalesced": True} and all(r == {"coalesced": True} for r in results[1:])


def test_a_request_made_after_a_cycle_began_gets_a_cycle_of_its_own(cycles: list[float]) -> None:
    tasks.schedule_cycle(time.time())
    time.sleep(0.01)
    tasks.schedule_cycle(time.time())
    tasks.schedule_cycle()  # a request without a time (from an older portal) always runs
    assert len(cycles) == 3
