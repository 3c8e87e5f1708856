"""Cleaning up after tests that run workloads for real."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from workers.backends.diskquota import mounted_from
from workers.backends.local import LocalBackend
from workers.backends.slurm import SlurmBackend


def stop_everything_of(owner: str) -> None:
    """Stop every process group and Slurm job a portal with this work directory started, whatever
    a failed test left in its database: nothing outlives the test."""
    LocalBackend().sweep_orphans(owner)
    if shutil.which("squeue"):
        SlurmBackend().sweep_orphans(owner)


def release_disks(image_dir: Path) -> None:
    """Unmount every workspace disk whose image lies in ``image_dir`` (lazily: a workload a failed
    test left behind may still hold one), and remove the images: no mount outlives the test."""
    if os.geteuid() == 0 and image_dir.exists():
        for mountpoint in mounted_from(str(image_dir)):
            subprocess.run(["umount", "-l", mountpoint], capture_output=True, check=False, timeout=60)
    shutil.rmtree(image_dir, ignore_errors=True)
