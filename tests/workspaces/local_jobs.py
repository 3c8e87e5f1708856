"""Jobs of the personas' workspaces run for real on this machine, with their workspace disks (as root):
what the disk quota's tests share."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.workloads import host
from apps.workspaces.actions import do_update_workspace
from apps.workspaces.models import Workspace
from tests.leftovers import release_disks, stop_everything_of
from tests.personas import World

GIB = 1 << 30

# Writes into the job's directory until the filesystem refuses, as fast as it can (big writes, no
# sync): prints how much it wrote and why it stopped.
FILL = r"""
import errno, os, sys
limit, block, written, why = int(sys.argv[1]), b"\0" * (8 << 20), 0, "done"
try:
    with open("filler", "wb", buffering=0) as out:
        while written < limit:
            written += out.write(block)
except OSError as exc:
    why = errno.errorcode.get(exc.errno, str(exc.errno))
print(f"WROTE {written} {why}", flush=True)
"""


def fill_command(limit_bytes: int) -> str:
    return f"python3 -c '{FILL}' {limit_bytes}"


def wrote(log: str) -> tuple[int, str]:
    """What a FILL job printed: (bytes written, why it stopped: "ENOSPC", "done")."""
    line = next(line for line in log.splitlines() if line.startswith("WROTE "))
    _, written, why = line.split()
    return int(written), why


@dataclass
class LocalPortal:
    world: World
    capture: Any
    root: Path

    def submit(self, workspace: Workspace, user: Any, command: str, **kwargs: Any) -> Job:
        with self.committed():
            job = check_submit_job(workspace, name="job", command=command, acting_user=user, **kwargs)
        job.refresh_from_db()
        return job

    def set_disk_gb(self, workspace: Workspace, disk_gb: int) -> Workspace:
        with self.committed():
            return do_update_workspace(workspace, disk_gb=disk_gb, acting_user=self.world.admin)

    def committed(self) -> AbstractContextManager[Any]:
        """What runs on commit (a job's start) runs by the block's end: in a test's transaction,
        through pytest-django's capture; in a transactional test, it has already."""
        return self.capture(execute=True) if self.capture is not None else contextlib.nullcontext()


def wait_for_content(path: Path, timeout_s: float = 30.0) -> str:
    """What a running job wrote to ``path``, once it has written something."""
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"nothing was written to {path}"
        time.sleep(0.05)
    return path.read_text()


def log_of(job: Job) -> str:
    return host.logs("job", job)[0].decode(errors="replace")


def local_portal(world: World, settings: Any, tmp_path: Path, capture: Any) -> Iterator[LocalPortal]:
    """The embedded layout in a temporary data directory, jobs started at once, disk quotas on; every
    workload stopped and every disk unmounted after the test, whatever happened."""
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    settings.PORTAL_RUN_DIR = tmp_path / "run"
    settings.PORTAL_DISK_IMAGE_DIR = tmp_path / "disks"
    settings.PORTAL_DISK_QUOTA = "on"
    try:
        yield LocalPortal(world, capture, tmp_path)
    finally:
        stop_everything_of(str(tmp_path / "work"))
        release_disks(tmp_path / "disks")
