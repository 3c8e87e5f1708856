"""What the queue's reasons say of nodes starting for the work that waits (apps/scheduling/adapter.py)."""

from __future__ import annotations

from datetime import datetime

from apps.elastic.models import PoolScaling


def starting_notes(now: datetime) -> dict[str, str]:
    """For the queue's reasons: the pending workloads nodes are starting for, and what they wait for."""
    notes: dict[str, str] = {}
    for starting in PoolScaling.objects.exclude(starting_for={}).values_list("starting_for", flat=True):
        for key, what in starting.items():
            ready_by = datetime.fromisoformat(what["ready_by"])
            if ready_by <= now:
                continue
            minutes = max(1, round((ready_by - now).total_seconds() / 60))
            count = int(what["nodes"])
            notes[key] = f"waiting for {count} node{'s' if count != 1 else ''} to start (at most {minutes} min)"
    return notes
