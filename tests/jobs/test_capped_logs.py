"""A job's log past its cap (PORTAL_LOG_MAX_MB), followed through the API with byte offsets as the
SDK, the CLI's ``logs -f`` and the job page do: the log's writer drops its oldest part and the
file shrinks, the offsets a follower holds stay good."""

from __future__ import annotations

import re
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.workloads.host import converge
from tests.personas import World

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)

MARKER = re.compile(r"\[portal\] log truncated: (\d+) bytes dropped\n")
FLOOD = 3_000_000  # three times the cap


def follow(client: Any, job: Job, offset: int) -> tuple[str, int]:
    """Everything from ``offset`` on, one answer at a time, and the offset to continue from."""
    text = ""
    while True:
        answer = client.get(f"/api/v1/jobs/{job.pk}/logs/", {"offset": offset}).json()
        if not answer["text"]:
            return text, offset
        text, offset = text + answer["text"], answer["offset"]


def wait_until(check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)
    return result


def test_a_follower_reads_a_capped_log_through_its_rewrites(
    world: World, settings: Any, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    settings.PORTAL_LOG_MAX_MB = 1
    command = f"echo first; yes xxxxxxxxx | head -c {FLOOD}; while [ ! -f go ]; do sleep 0.05; done; echo after"
    with django_capture_on_commit_callbacks(execute=True):
        job = check_submit_job(world.team_a, name="flood", command=command, acting_user=world.alice,
                               gpu_type="h100", gpus_per_replica=Decimal("1"))  # fmt: skip
    client = world.client(world.alice)

    # Once the flood is all written (a follower that read along meanwhile is where it ended), a new
    # reader from the top gets the marker and the most recent part.
    wait_until(lambda: follow(client, job, 0)[1] == 6 + FLOOD)
    text, offset = follow(client, job, 0)

    marker = MARKER.match(text)
    assert marker is not None
    assert len(text) - marker.end() == 6 + FLOOD - int(marker.group(1)) <= 1 << 20
    assert text.endswith("xxxxxxxxx\n")
    job.refresh_from_db()
    (Path(job.backend_state["job_dir"]) / "go").touch()
    more = wait_until(lambda: (lambda read: read if read[0] else None)(follow(client, job, offset)))
    assert more == ("after\n", offset + 6)  # no byte twice, none lost
    assert follow(client, job, 10**12)[0] == text + "after\n"  # past the end: from the top
    assert wait_until(lambda: converge("job", job.pk) and Job.objects.get(pk=job.pk).state == Job.State.SUCCEEDED)
