"""The Slurm backend against the REAL Slurm that deploy/slurm.sh runs (no mocks).

The cluster must be up (``bash deploy/slurm.sh start``); when it is not, every test here FAILS
with a message saying so (a skipped backend test would hide a broken CI setup).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.backends import BackendError, JobSpec, PolicyRefusal, Status
from workers.backends.slurm import SlurmBackend, parse_exit, run_command

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 15.0
START_TIMES: list[float] = []


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster() -> Iterator[None]:
    """Fail (not skip) every test when the cluster does not answer."""
    try:
        status = subprocess.run(
            ["bash", str(REPO / "deploy" / "slurm.sh"), "status"], capture_output=True, text=True, timeout=30
        )
        sinfo = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"Slurm is not available ({exc}); start it with `bash deploy/slurm.sh start`")
    if status.returncode != 0 or sinfo.returncode != 0 or not sinfo.stdout.strip():
        pytest.fail(
            "Slurm is not running: `bash deploy/slurm.sh status` said\n"
            f"{status.stdout}{status.stderr}\nsinfo: {sinfo.stdout}{sinfo.stderr}\n"
            "start it with `bash deploy/slurm.sh start`"
        )
    yield
    if START_TIMES:
        print(f"\nsbatch -> RUNNING: median {statistics.median(START_TIMES):.3f}s over {len(START_TIMES)} jobs")


@pytest.fixture
def backends() -> Iterator[list[SlurmBackend]]:
    """Backends made by a test; whatever they still run is cancelled afterwards."""
    made: list[SlurmBackend] = []
    yield made
    for backend in made:
        with contextlib.suppress(BackendError):
            backend.stop(grace_s=0.5)


@pytest.fixture
def make(backends: list[SlurmBackend]) -> Callable[[], SlurmBackend]:
    def factory() -> SlurmBackend:
        backend = SlurmBackend(start_timeout_s=15)
        backends.append(backend)
        return backend

    return factory


def spec(tmp_path: Path, key: str, command: str, **kwargs: Any) -> JobSpec:
    return JobSpec(key=key, workspace="ws", name=key, command=command, work_dir=str(tmp_path), **kwargs)


def timed_start(backend: SlurmBackend, job: JobSpec) -> None:
    began = time.monotonic()
    backend.start(job)
    START_TIMES.append(time.monotonic() - began)


def wait_exit(backend: SlurmBackend, timeout: float = DEADLINE_S) -> Status:
    deadline = time.monotonic() + timeout
    while True:
        status = backend.poll()
        if not status.running:
            return status
        if time.monotonic() > deadline:
            pytest.fail(f"job still running after {timeout}s")
        time.sleep(0.1)


def squeue_lists(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.strip()


def test_one_gpu_job_sees_its_gpu_and_exits_zero(tmp_path: Path, make: Callable[[], SlurmBackend]) -> None:
    backend = make()
    command = 'echo "CVD=$CUDA_VISIBLE_DEVICES SECRET=${PORTAL_TEST_SECRET:-unset} FOO=$FOO"; echo PROGRESS 0.25; '
    command += "echo hello > artifacts/out.txt"
    job = spec(tmp_path, "one-gpu", command, devices=[["0"]], env={"FOO": "a b'c"}, max_runtime_s=30)
    timed_start(backend, job)
    status = wait_exit(backend)
    assert status == Status("exited", 0, "exited")
    assert backend.poll() == status  # repeated polls give the same answer
    log = backend.logs(0)[0].decode()
    match = re.search(r"CVD=(\S*) SECRET=(\S+) FOO=(.*)", log)
    assert match, log
    assert match.group(1) != "", log
    assert match.group(2) == "unset"  # the worker's environment does not reach the job
    assert match.group(3) == "a b'c"
    progress = backend.progress()
    assert progress is not None and progress.fraction == 0.25
    assert backend.artifacts().files == [("artifacts/out.txt", 6, hashlib.sha256(b"hello\n").hexdigest())]
    data, offset = backend.logs(0)
    assert backend.logs(0, offset) == (b"", offset)
    with pytest.raises(BackendError) as err:
        backend.logs(1)
    assert err.value.permanent


def test_two_node_gang_gets_ranks_and_one_master(tmp_path: Path, make: Callable[[], SlurmBackend]) -> None:
    backend = make()
    command = 'echo "RANK=$RANK WORLD=$WORLD_SIZE LOCAL=$LOCAL_RANK '
    command += 'MASTER=$MASTER_ADDR:$MASTER_PORT GPUS=$CUDA_VISIBLE_DEVICES"'
    job = spec(tmp_path, "gang", command, replicas=2, devices=[["0", "1", "2", "3"], ["0", "1", "2", "3"]])
    timed_start(backend, job)
    assert wait_exit(backend).exit_code == 0
    seen = []
    for replica in (0, 1):
        log = backend.logs(replica)[0].decode()
        match = re.search(r"RANK=(\d) WORLD=(\d) LOCAL=(\d) MASTER=(\S+) GPUS=(\S+)", log)
        assert match, log
        seen.append(match.groups())
    assert [s[0] for s in seen] == ["0", "1"]
    assert all(s[1] == "2" and s[2] == "0" for s in seen)
    assert seen[0][3] == seen[1][3] and seen[0][3].startswith("node")
    assert all(len(s[4].split(",")) == 4 for s in seen)


def test_failing_job_reports_its_exit_code(tmp_path: Path, make: Callable[[], SlurmBackend]) -> None:
    backend = make()
    timed_start(backend, spec(tmp_path, "fails", "echo failing; exit 3"))
    status = wait_exit(backend)
    assert status.exit_code == 3, status
    assert "3" in status.message


def test_an_older_job_with_the_same_id_in_accounting_is_not_taken_for_the_job(
    tmp_path: Path, backends: list[SlurmBackend]
) -> None:
    """Slurm numbers jobs from its first id again once its saved state is lost, and accounting keeps
    the older jobs: ``sacct -j ID`` answers for the latest job with the id, an older one until the
    new job's record reaches slurmdbd. The backend asks only for jobs submitted since its own."""
    older = SlurmBackend(start_timeout_s=15)
    backends.append(older)
    older.start(spec(tmp_path, "older", "exit 3"))
    assert wait_exit(older).exit_code == 3
    sacct = tmp_path / "sacct"  # sacct over an accounting database that holds the older job under every id
    sacct.write_text(
        "#!/bin/bash\n"
        'case " $* " in *" -S "*) exec sacct "$@" ;; esac\n'
        'args=("$@")\n'
        'for i in "${!args[@]}"; do\n'
        '  [ "${args[$i]}" = -j ] && asked=${args[$((i + 1))]} && args[$((i + 1))]=OLDER\n'
        "done\n"
        'sacct "${args[@]}" | sed "s/^OLDER|/$asked|/"\n'.replace("OLDER", older.get_state()["job_id"])
    )
    sacct.chmod(0o755)
    for polled_together in (False, True):
        backend = SlurmBackend(start_timeout_s=15, sacct_path=str(sacct))
        backends.append(backend)
        backend.start(spec(tmp_path, f"newer-{polled_together}", "exit 0"))
        deadline = time.monotonic() + DEADLINE_S
        while True:
            with backend.polling([backend.get_state()]) if polled_together else contextlib.nullcontext():
                status = backend.poll()
            if not status.running or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status == Status("exited", 0, "exited")


def test_stop_cancels_and_leaves_squeue_empty(tmp_path: Path, make: Callable[[], SlurmBackend]) -> None:
    backend = make()
    command = 'trap "echo got TERM; exit 5" TERM; echo started; sleep 60 & wait'
    timed_start(backend, spec(tmp_path, "cancel-me", command, devices=[["0"]]))
    job_id = backend.get_state()["job_id"]
    assert squeue_lists(job_id) == "RUNNING"
    assert backend.poll().running
    deadline = time.monotonic() + 30  # RUNNING in squeue is not yet the script's trap: wait for it
    while b"started" not in backend.logs(0)[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    backend.stop(grace_s=3)
    assert squeue_lists(job_id) == ""
    status = wait_exit(backend)
    assert status == Status("exited", 5, "stopped on request")  # the job saw SIGTERM and exited gracefully
    assert "got TERM" in backend.logs(0)[0].decode()
    backend.stop(grace_s=3)  # idempotent
    assert backend.poll() == status


def test_reattach_after_restart_can_poll(tmp_path: Path, make: Callable[[], SlurmBackend]) -> None:
    first = make()
    job = spec(tmp_path, "reattach", "sleep 1; echo done")
    timed_start(first, job)
    state = first.get_state()
    assert state["job_id"] and state["key"] == "reattach" and state["logs"]
    second = make()
    second.load_state(state)
    assert second.start(job).port == first.start(job).port  # start() again while running: same endpoint
    status = wait_exit(second)
    assert status.exit_code == 0
    assert b"done" in second.logs(0)[0]
    second.clear_state()
    with pytest.raises(BackendError):
        second.poll()
    with pytest.raises(BackendError) as err:
        SlurmBackend().load_state({"version": 99, "job_id": "1"})
    assert err.value.permanent


def test_five_gpus_per_node_is_refused(tmp_path: Path, make: Callable[[], SlurmBackend]) -> None:
    backend = make()
    with pytest.raises(PolicyRefusal, match="Requested node configuration is not available"):
        backend.start(spec(tmp_path, "too-big", "true", devices=[["0", "1", "2", "3", "4"]]))


def test_discover_reports_four_nodes_of_four_h100() -> None:
    gpus = SlurmBackend().discover()
    assert len(gpus) == 16
    assert {g.index.split(":")[0] for g in gpus} == {"node1", "node2", "node3", "node4"}
    assert {g.name for g in gpus} == {"h100"}
    assert gpus[0].index == "node1:0" and gpus[-1].index == "node4:3"


def test_run_command_errors() -> None:
    with pytest.raises(BackendError) as err:
        run_command(["sleep", "5"], timeout=0.2)
    assert not err.value.permanent
    with pytest.raises(BackendError) as err:
        run_command(["sbatch", "--gres=tpu:1", "--wrap", "true"], timeout=10)
    assert err.value.permanent and "Invalid generic resource" in err.value.message
    with pytest.raises(BackendError) as err:
        run_command(["false"], timeout=5)
    assert not err.value.permanent


def test_parse_exit() -> None:
    assert parse_exit("COMPLETED", "0:0") == Status("exited", 0, "exited")
    assert parse_exit("FAILED", "7:0").exit_code == 7
    assert parse_exit("TIMEOUT", "0:15").exit_code == 124
    assert parse_exit("CANCELLED by 0", "0:15").message.startswith("cancelled")
    assert parse_exit("NODE_FAIL", "0:0").exit_code == 255


# -- adopt(): a start whose worker died before recording it -------------------------------------


def test_adopt_takes_over_a_running_job_then_logs_and_stop_act_on_it(
    tmp_path: Path, make: Callable[[], SlurmBackend]
) -> None:
    job = spec(tmp_path, "adopt-running", "echo started; sleep 60")
    lost = make()
    lost.start(job)  # its worker dies now: the state is never saved
    job_id = lost.get_state()["job_id"]

    adopter = make()
    endpoint = adopter.adopt(job)

    assert endpoint == lost.start(job)  # the same job, reached at the same place
    assert adopter.get_state()["job_id"] == job_id and adopter.get_state()["nodes"]
    assert adopter.poll().running
    deadline = time.monotonic() + DEADLINE_S
    while b"started" not in adopter.logs(0)[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert adopter.logs(0)[0] == b"started\n"
    adopter.stop(grace_s=1)
    assert squeue_lists(job_id) == ""
    status = wait_exit(adopter)
    assert status.message == "stopped on request"


def test_adopt_of_a_job_that_ended_polls_its_exit_code(tmp_path: Path, make: Callable[[], SlurmBackend]) -> None:
    job = spec(tmp_path, "adopt-ended", "echo PROGRESS 0.5; exit 7")
    lost = make()
    lost.start(job)
    wait_exit(lost)  # it ended after its worker died: nobody recorded anything

    adopter = make()
    assert adopter.adopt(job) is not None

    assert adopter.get_state()["job_id"] == lost.get_state()["job_id"]
    assert wait_exit(adopter).exit_code == 7
    progress = adopter.progress()
    assert progress is not None and progress.fraction == 0.5
    assert make().adopt(job) is not None  # until the portal records it, any takeover finds it


def test_adopt_finds_only_the_job_of_its_key_in_its_directory(tmp_path: Path, make: Callable[[], SlurmBackend]) -> None:
    lost = make()
    lost.start(spec(tmp_path / "here", "adopt-key", "sleep 60"))

    assert make().adopt(spec(tmp_path / "here", "adopt-other-key", "sleep 60")) is None
    assert make().adopt(spec(tmp_path / "elsewhere", "adopt-key", "sleep 60")) is None  # another portal's
    assert squeue_lists(lost.get_state()["job_id"]) == "RUNNING"  # left alone
    assert make().adopt(spec(tmp_path / "here", "adopt-key", "sleep 60")) is not None


def test_adopt_takes_over_a_gang_as_a_whole(tmp_path: Path, make: Callable[[], SlurmBackend]) -> None:
    job = spec(tmp_path, "adopt-gang", 'echo "rank $RANK"; sleep 60', replicas=2)
    lost = make()
    lost.start(job)

    adopter = make()
    assert adopter.adopt(job) is not None

    assert adopter.get_state()["nodes"] == lost.get_state()["nodes"] and len(adopter.get_state()["nodes"]) == 2
    deadline = time.monotonic() + DEADLINE_S
    while b"rank 1" not in adopter.logs(1)[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert adopter.logs(0)[0] == b"rank 0\n" and adopter.logs(1)[0] == b"rank 1\n"
    adopter.stop(grace_s=1)
    assert squeue_lists(lost.get_state()["job_id"]) == ""


def test_adopt_cancels_a_job_of_another_shape(tmp_path: Path, make: Callable[[], SlurmBackend]) -> None:
    lost = make()
    lost.start(spec(tmp_path, "adopt-shape", "sleep 60", replicas=2))

    assert make().adopt(spec(tmp_path, "adopt-shape", "sleep 60")) is None  # one replica: not this job
    assert squeue_lists(lost.get_state()["job_id"]) == ""  # the start that follows runs alone


def test_adopt_skips_a_recorded_start_and_one_the_portal_cancelled(
    tmp_path: Path, make: Callable[[], SlurmBackend]
) -> None:
    recorded = spec(tmp_path, "adopt-recorded", "exit 3")
    first = make()
    first.start(recorded)
    wait_exit(first)
    assert make().adopt(recorded) is not None  # not recorded yet
    make().load_state(first.get_state())  # the portal reattaches: the start was recorded
    assert make().adopt(recorded) is None

    swept = spec(tmp_path, "adopt-swept", "sleep 60")
    orphan = SlurmBackend(start_timeout_s=15, owner=str(tmp_path))  # an owner of its own: only it is swept
    orphan.start(swept)
    job_id = orphan.get_state()["job_id"]
    assert SlurmBackend(owner=str(tmp_path)).sweep_orphans(str(tmp_path)) == [job_id]
    deadline = time.monotonic() + DEADLINE_S  # scancel returns at once; a takeover comes much later
    while squeue_lists(job_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert make().adopt(swept) is None
