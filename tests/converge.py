"""Driving a local job to its end as the worker's reconcile loop would, for tests that run real processes."""

from __future__ import annotations

import time

from apps.jobs.models import Job
from apps.workloads import host


def settle(job: Job, timeout_s: float = 60.0) -> Job:
    """Converge the job until it has ended (its row is final); an AssertionError saying where it
    stands if it has not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        host.converge("job", job.pk)
        job.refresh_from_db()
        if job.is_final:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job.pk} is still {job.state}: {job.failure_reason}")
