"""The live portal the SDK and CLI tests share (tests/sdk/conftest.py): its workspaces' disks are
its own, outside the per-test release of disks, and a wait on one of its workloads that ended
fails at once, saying why it ended."""

from __future__ import annotations

import os
import time

import pytest
from gpuportal import Client

from tests.conftest import DISK_IMAGE_DIR
from tests.sdk.conftest import LivePortal, wait_for
from workers.backends.diskquota import mounted_from

pytestmark = pytest.mark.slow


@pytest.mark.skipif(os.geteuid() != 0, reason="a workspace's directory is a mounted disk only where the portal is root")
@pytest.mark.skipif(os.environ.get("PORTAL_DISK_QUOTA") == "off", reason="the portal runs without disk quotas")
def test_the_portals_workspace_disks_are_not_those_released_after_each_test(
    portal_client: Client, live_portal: LivePortal
) -> None:
    # Released after each test, they would go from under what the portal still starts or runs for
    # the next one (its disk upkeep mounts an image again as the release removes it).
    job = portal_client.jobs.submit(name="disk", workspace="demo-team", command="true")
    assert job.wait(timeout=60).succeeded, job.failure_reason
    work = os.environ.get("PORTAL_WORK_DIR") or str(live_portal.data_dir / "work")
    directory = os.path.realpath(os.path.join(work, "demo-team"))
    assert directory in mounted_from(str(live_portal.data_dir / "disks"))
    assert directory not in mounted_from(str(DISK_IMAGE_DIR))


def test_a_wait_for_a_state_a_job_ended_without_fails_at_once_saying_why(portal_client: Client) -> None:
    job = portal_client.jobs.submit(name="ends", workspace="demo-team", command="echo on my way out; exit 3")
    job.wait(timeout=60)
    asked = time.monotonic()
    with pytest.raises(AssertionError) as ended:
        wait_for(portal_client, job.id, lambda j: j.state == "RUNNING", timeout_s=60)
    assert time.monotonic() - asked < 20  # not after the whole timeout
    said = str(ended.value)
    assert said.startswith(f"ended instead: <Job {job.id} ends FAILED exit code 3>: "), said
    assert "on my way out" in said  # the end of its log
