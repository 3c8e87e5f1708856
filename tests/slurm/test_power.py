"""Elastic nodes on the real Slurm of deploy/slurm.sh: node5 and node6, partition elastic, under Slurm's
power saving. They start powered down (no slurmd runs); powering one up starts its slurmd through
Slurm's ResumeProgram (deploy/slurm-power.sh) and jobs run there; powering it down stops the slurmd
again. The portal never powers a node down under running work, and a power-up that fails (the test
marker /run/slurm/power-fail-NODE makes the ResumeProgram fail for NODE) ends reported as failed.

Each test begins and ends with both nodes powered down: a power-up costs about 3 s, a power-down
SuspendTimeout (5 s), a failed power-up ResumeTimeout (30 s).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from workers.backends.base import BackendError
from workers.backends.slurm_power import NodePower, drain, node_power, parse_node_power, power_down, power_up, resume

pytestmark = pytest.mark.slow  # real Slurm, nodes powered up and down: run first (tests/conftest.py)

ELASTIC = ("node5", "node6")
RUN_DIR = Path("/run/slurm")
RESUME_TIMEOUT_S = 30.0  # deploy/slurm.sh
SUSPEND_TIMEOUT_S = 5.0


def wait_for(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g}s"
        time.sleep(0.25)


def power(node: str) -> NodePower:
    return node_power([node])[node]


def slurmd_runs(node: str) -> bool:
    """The node's slurmd (by its pid file) is alive: the simulated machine is on."""
    try:
        pid = int((RUN_DIR / f"slurmd-{node}.pid").read_text().split()[0])
        return Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd"
    except (OSError, ValueError, IndexError):
        return False


def sinfo_state(node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"], capture_output=True, text=True, timeout=15)
    return out.stdout.strip()


def squeue_line(job_id: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%N"], capture_output=True, text=True, timeout=15)
    return out.stdout.strip().split("|") if out.stdout.strip() else []


def sbatch(*args: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", "-p", "elastic", *args], capture_output=True, text=True, timeout=15)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def powered_down(nodes: tuple[str, ...]) -> None:
    """Bring ``nodes`` to powered down and in service, whatever a test (or an aborted run) left."""
    subprocess.run(["scancel", "-p", "elastic"], capture_output=True, timeout=15)
    for node in nodes:
        (RUN_DIR / f"power-fail-{node}").unlink(missing_ok=True)
    wait_for(lambda: not any(power(n).busy for n in nodes), "jobs in partition elastic ended", 30)
    wait_for(lambda: not any(power(n).powered == "powering_up" for n in nodes), "power-ups ended", RESUME_TIMEOUT_S + 5)
    resume(list(nodes))  # failed or drained ones back in service (a failed one is counted powered down)
    power_down(list(nodes))
    wait_for(lambda: all(power(n).powered == "down" for n in nodes), "both powered down", SUSPEND_TIMEOUT_S + 15)
    resume(list(nodes))
    wait_for(lambda: not any(slurmd_runs(n) for n in nodes), "their slurmd stopped", 10)


@pytest.fixture
def elastic() -> Iterator[tuple[str, ...]]:
    powered_down(ELASTIC)
    yield ELASTIC
    powered_down(ELASTIC)


def test_it_starts_with_the_elastic_nodes_powered_down(elastic: tuple[str, ...]) -> None:
    for node in elastic:
        assert power(node).powered == "down"
        assert "POWERED_DOWN" in power(node).state
        assert sinfo_state(node) == "idle~"  # sinfo's mark of a powered-down node
        assert not slurmd_runs(node)
    assert {p.powered for p in node_power(["node1", "node2", "node3", "node4"]).values()} == {"up"}


def test_a_powered_up_node_runs_a_job_and_powers_down_after_a_drain(elastic: tuple[str, ...]) -> None:
    started = time.monotonic()
    power_up(["node5"])
    assert power("node5").powered in {"powering_up", "up"}
    wait_for(lambda: power("node5").powered == "up", "node5 up", RESUME_TIMEOUT_S)
    assert time.monotonic() - started < RESUME_TIMEOUT_S
    assert power("node5").state == "IDLE"
    assert slurmd_runs("node5")
    assert power("node6").powered == "down"

    job = sbatch("-N", "1", "--gres=gpu:4", "-o", "/dev/null", "--wrap", "sleep 300")
    wait_for(lambda: squeue_line(job) == ["RUNNING", "node5"], f"job {job} running on node5", 15)
    assert power("node5").busy

    drain(["node5"], "test: shrinking the pool")
    assert power("node5").drained
    assert power("node5").reason.startswith("test: shrinking the pool")
    with pytest.raises(BackendError, match="jobs run there") as refused:
        power_down(["node5"])
    assert refused.value.permanent
    assert power("node5").powered == "up"
    assert slurmd_runs("node5")  # the job's node stays on

    subprocess.run(["scancel", job], capture_output=True, timeout=15)
    wait_for(lambda: not power("node5").busy, "node5 free", 30)
    power_down(["node5"])
    assert power("node5").powered == "powering_down"
    wait_for(lambda: power("node5").powered == "down", "node5 down", SUSPEND_TIMEOUT_S + 10)
    assert not slurmd_runs("node5")
    resume(["node5"])
    assert not power("node5").drained and power("node5").powered == "down"


def test_slurm_powers_a_node_up_for_a_job_that_needs_it_with_its_gpus(elastic: tuple[str, ...], tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    os.chmod(tmp_path, 0o777)
    job = sbatch("-N", "1", "--gres=gpu:4", "-w", "node6", "-o", str(out), "--wrap", "echo $CUDA_VISIBLE_DEVICES")
    wait_for(lambda: power("node6").powered in {"powering_up", "up"}, "node6 powering up for the job", 15)
    assert power("node6").busy  # allocated to the job while it boots: never powered down meanwhile
    with pytest.raises(BackendError, match="jobs run there"):
        power_down(["node6"])
    wait_for(lambda: not squeue_line(job), f"job {job} ended", RESUME_TIMEOUT_S + 45)
    assert out.read_text().strip() == "0,1,2,3"
    assert power("node6").powered == "up"


def test_a_power_up_that_fails_is_reported_failed(elastic: tuple[str, ...]) -> None:
    (RUN_DIR / "power-fail-node6").touch()
    power_up(["node6"])
    wait_for(lambda: power("node6").powered != "powering_up", "node6's power-up ended", RESUME_TIMEOUT_S + 15)
    failed = power("node6")
    assert failed.powered == "failed"
    assert failed.reason.startswith("ResumeTimeout reached")
    assert not slurmd_runs("node6")
    power_up(["node6"])  # a failed node is not powered up again until resumed
    assert power("node6").powered == "failed"

    (RUN_DIR / "power-fail-node6").unlink()
    resume(["node6"])
    assert power("node6").powered == "down"
    power_up(["node6"])
    wait_for(lambda: power("node6").powered == "up", "node6 up after all", RESUME_TIMEOUT_S)


def test_it_refuses_unknown_nodes(elastic: tuple[str, ...]) -> None:
    with pytest.raises(BackendError, match="no node node99") as unknown:
        power_up(["node99"])
    assert unknown.value.permanent
    with pytest.raises(BackendError, match="not Slurm node names"):
        power_down(["node5 State=DOWN"])


@pytest.mark.parametrize(
    ("state", "powered", "busy", "drained"),
    [
        ("IDLE+POWERED_DOWN", "down", False, False),
        ("IDLE+POWER_UP+POWERED_DOWN", "powering_up", False, False),
        ("IDLE+NOT_RESPONDING+POWERING_UP", "powering_up", False, False),
        ("IDLE", "up", False, False),
        ("MIXED", "up", True, False),
        ("ALLOCATED+DRAIN", "up", True, True),
        ("IDLE+COMPLETING", "up", True, False),
        ("IDLE+POWER_DOWN", "powering_down", False, False),
        ("IDLE+DRAIN+POWERING_DOWN", "powering_down", False, True),
        ("MIXED+POWERED_DOWN", "down", True, False),
        ("DOWN+POWERED_DOWN+NOT_RESPONDING", "failed", False, False),
        ("DOWN*", "failed", False, False),
    ],
)
def test_it_reads_slurms_node_states(state: str, powered: str, busy: bool, drained: bool) -> None:
    got = parse_node_power("node5", state)
    assert (got.powered, got.busy, got.drained) == (powered, busy, drained)
