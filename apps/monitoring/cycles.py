"""A scheduling cycle, timed: what the scheduler loop and the worker's cycle task run."""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError
from django.db.models import F
from django.utils import timezone

from apps.monitoring.models import SchedulerStats
from apps.scheduling.adapter import CycleResult, run_cycle

logger = logging.getLogger(__name__)


def timed_cycle() -> CycleResult:
    """`run_cycle()`, its time and outcome added to the totals the metrics report."""
    began = time.perf_counter()
    try:
        result = run_cycle()
    except Exception:
        _record(time.perf_counter() - began, failed=True)
        raise
    _record(time.perf_counter() - began, failed=False)
    return result


def _record(seconds: float, *, failed: bool) -> None:
    try:
        updated = SchedulerStats.objects.filter(pk=SchedulerStats.ROW).update(
            cycles=F("cycles") + 1,
            cycle_seconds=F("cycle_seconds") + seconds,
            last_cycle_seconds=seconds,
            last_cycle_at=timezone.now(),
            failures=F("failures") + int(failed),
        )
        if not updated:
            SchedulerStats.objects.get_or_create(
                pk=SchedulerStats.ROW,
                defaults={
                    "cycles": 1,
                    "cycle_seconds": seconds,
                    "last_cycle_seconds": seconds,
                    "last_cycle_at": timezone.now(),
                    "failures": int(failed),
                },
            )
    except DatabaseError:  # the totals are for watching; a cycle never fails for them
        logger.warning("could not record the scheduling cycle's time", exc_info=True)
