"""Cleaning up after tests that run workloads for real."""

from __future__ import annotations

import shutil

from workers.backends.local import LocalBackend
from workers.backends.slurm import SlurmBackend


def stop_everything_of(owner: str) -> None:
    """Stop every process group and Slurm job a portal with this work directory started, whatever
    a failed test left in its database: nothing outlives the test."""
    LocalBackend().sweep_orphans(owner)
    if shutil.which("squeue"):
        SlurmBackend().sweep_orphans(owner)
