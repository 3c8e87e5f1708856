"""Cleaning up after tests that run workloads for real."""

from __future__ import annotations

import shutil

from workers.backends import local, slurm


def stop_everything_of(owner: str) -> None:
    """Stop every process group and Slurm job a portal with this work directory started, whatever
    a failed test left in its database: nothing outlives the test."""
    local.sweep_orphans(owner, keep_pids=set(), keep_keys=set())
    if shutil.which("squeue"):
        slurm.sweep_orphans(owner, keep_ids=set(), keep_keys=set())
