"""A job that floods its log, for real: it writes as fast as it can for a few seconds, as a job of
team-a on the local backend started through the portal, while a user of team-b goes on using a
live portal. Its log, in the portal's own run directory, never holds much more than the cap
(PORTAL_LOG_MAX_MB, workers/backends/logcap.py), keeps its last lines and says how much was
dropped; team-b's p95 latency listing its jobs stays within its budget (tests/security/pressure.py).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.workloads import host
from tests.converge import settle
from tests.personas import World, api_token
from tests.security.pressure import Bystander, assert_within_budget
from workers.backends.logcap import READ_SIZE

CAP_MB = 2
# Lines of 100 bytes, as fast as `yes` makes them, for four seconds; then a last line.
FLOOD = "timeout 4 yes " + "f" * 99 + "; echo flood over"


@pytest.fixture
def flood_settings(tx_world: World, live_server: Any, settings: Any, tmp_path: Path) -> Iterator[Bystander]:
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    settings.PORTAL_RUN_DIR = tmp_path / "run"
    settings.PORTAL_LOG_MAX_MB = CAP_MB
    try:
        yield Bystander(live_server.url, "/api/v1/jobs/?workspace=team-b", api_token(tx_world.charlie))
    finally:
        host.stop_on_this_machine()


def alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rindex(")") + 2 :].split()[0] not in ("Z", "X")


@pytest.mark.skipif(os.geteuid() != 0, reason="a job's cgroups, which the portal makes for every job, need root")
@pytest.mark.pressure
def test_a_job_flooding_its_log_stays_under_the_cap_and_slows_no_one_down(
    tx_world: World, flood_settings: Bystander
) -> None:
    bystander = flood_settings
    idle = bystander.measure()
    job = check_submit_job(tx_world.team_a, name="flood", command=FLOOD, acting_user=tx_world.alice,
                           gpu_type="h100", gpus_per_replica=Decimal("1"), cpu_cores=1)  # fmt: skip
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING, job.failure_reason
    replica = job.backend_state["replicas"][0]
    flooding, largest = threading.Event(), [0]
    flooding.set()

    def watch() -> None:  # the log's size all along, until the job's wrapper is gone
        while alive(replica["pid"]):
            try:
                largest[0] = max(largest[0], os.stat(replica["log"]).st_size)
            except FileNotFoundError:  # between a rewrite's two names: never, os.replace is atomic
                largest[0] = -1
            time.sleep(0.005)
        flooding.clear()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    attacked = bystander.measure_while(flooding)
    watcher.join(timeout=60)
    job = settle(job)

    log = Path(replica["log"]).read_bytes()
    marker = re.match(rb"\[portal\] log truncated: (\d+) bytes dropped\n", log)
    assert job.state == Job.State.SUCCEEDED, (job.state, job.failure_reason)
    assert marker is not None and int(marker.group(1)) > 10 * (CAP_MB << 20), log[:100]  # a flood it was
    assert 0 < largest[0] <= (CAP_MB << 20) + READ_SIZE and len(log) <= (CAP_MB << 20) + READ_SIZE
    assert log.endswith(b"f" * 99 + b"\nflood over\n")
    assert_within_budget(idle, attacked)
