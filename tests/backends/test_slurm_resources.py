"""Every job the Slurm backend submits (instances and notebooks are jobs too) asks Slurm for its CPU
cores and memory, against the real Slurm of deploy/slurm.sh: with Slurm's cgroup enforcement on
the nodes (docs/slurm.md), that is what holds it to them."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.backends.test_slurm import backends, make, slurm_cluster, spec, wait_exit  # noqa: F401 (fixtures)
from workers.backends.slurm import SlurmBackend


def test_a_job_asks_slurm_for_its_cpu_cores_and_memory(tmp_path: Path, make: Callable[[], SlurmBackend]) -> None:  # noqa: F811
    backend = make()
    backend.start(spec(tmp_path, "sized", "sleep 5", cpu_cores=2, memory_gb=2))

    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", str(backend.get_state()["job_id"])],
        capture_output=True,
        text=True,
        timeout=15,
    ).stdout

    assert re.search(r"\bMinCPUsNode=2\b", shown) and re.search(r"\bNumCPUs=2\b", shown), shown
    assert re.search(r"\bMinMemoryNode=2G\b", shown), shown
    backend.stop(grace_s=0.5)
    assert wait_exit(backend).exit_code != 0
