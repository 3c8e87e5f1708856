"""Taking over a local start whose worker died before recording it (``LocalBackend.adopt``).

The worker is a real Python process that starts the workload and is then killed with SIGKILL, as
a worker is between starting a workload and saving its state; the backend that takes over is a
new object with no state, as the portal builds after a restart. No mocks: bash processes, /proc.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.backends.test_local import group_members, log_text, wait_exit, wait_for
from workers.backends import JobSpec, Status
from workers.backends.base import STOPPED_EXIT_CODE, UNKNOWN_EXIT_CODE, InstanceSpec, Keep
from workers.backends.local import LocalBackend

REPO = Path(__file__).resolve().parents[2]

# Starts a spec, prints the state it would have saved, and dies before saving it. With a rank to
# die at, it dies as it is about to spawn that replica: a gang started in part. With a rank to die
# after, it dies as soon as that replica is spawned, before the start's record names it.
DOOMED_WORKER = r"""
import json, os, signal, sys
from workers.backends.base import InstanceSpec, JobSpec
from workers.backends.local import LocalBackend

kind, fields, settings, die_at_rank, die_after_rank = json.loads(sys.argv[1])
spawn = LocalBackend._spawn

def spawn_or_die(self, spec, rank, *args):
    if rank == die_at_rank:
        print(json.dumps(self.get_state()), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    go = spawn(self, spec, rank, *args)
    if rank == die_after_rank:
        print(json.dumps(self.get_state()), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return go

LocalBackend._spawn = spawn_or_die
backend = LocalBackend(**settings)
backend.start((InstanceSpec if kind == "instance" else JobSpec)(**fields))
print(json.dumps(backend.get_state()), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@dataclasses.dataclass
class Place:
    """Where a test's workloads run: its own work and run directories, the portal's owner."""

    owner: Path
    run_dir: Path

    def spec(self, command: str, **kwargs: Any) -> JobSpec:
        fields: dict[str, Any] = {"key": "job-1", "workspace": "ws", "name": "test", "work_dir": str(self.owner / "ws")}
        return JobSpec(command=command, **{**fields, **kwargs})

    def backend(self, made: list[LocalBackend]) -> LocalBackend:
        backend = LocalBackend(teardown_grace_s=1.0, owner=str(self.owner), run_dir=str(self.run_dir))
        made.append(backend)
        return backend

    def start_in_dying_worker(
        self, spec: JobSpec | InstanceSpec, die_at_rank: int | None = None, die_after_rank: int | None = None
    ) -> dict[str, Any]:
        """Start ``spec`` in a worker killed before it records the start; the state it never saved."""
        kind = "instance" if isinstance(spec, InstanceSpec) else "job"
        settings = {"teardown_grace_s": 1.0, "owner": str(self.owner), "run_dir": str(self.run_dir)}
        argument = json.dumps([kind, dataclasses.asdict(spec), settings, die_at_rank, die_after_rank])
        worker = subprocess.run(
            [sys.executable, "-c", DOOMED_WORKER, argument], cwd=REPO, capture_output=True, text=True, timeout=30
        )
        assert worker.returncode == -9, worker.stderr  # killed, not finished
        state: dict[str, Any] = json.loads(worker.stdout.splitlines()[-1])
        return state


@pytest.fixture
def place(tmp_path: Path) -> Place:
    return Place(owner=tmp_path / "work", run_dir=tmp_path / "run")


@pytest.fixture
def made(place: Place) -> Iterator[list[LocalBackend]]:
    """Backends a test made; afterwards, whatever the test's workloads left running is killed."""
    backends: list[LocalBackend] = []
    yield backends
    for backend in backends:
        if backend.get_state():
            backend.stop(grace_s=0)
    place.backend([]).sweep_orphans(str(place.owner))


def pgids(state: dict[str, Any]) -> list[int]:
    return [int(replica["pgid"]) for replica in state["replicas"]]


def all_ended(state: dict[str, Any]) -> Callable[[], bool]:
    return lambda: all(group_members(pgid) == [] for pgid in pgids(state))


def test_it_adopts_a_running_job_and_then_polls_logs_and_stops_it(place: Place, made: list[LocalBackend]):
    spec = place.spec("echo up; sleep 100")
    lost = place.start_in_dying_worker(spec)
    assert all(group_members(pgid) for pgid in pgids(lost))  # the job outlived its worker

    backend = place.backend(made)
    endpoint = backend.adopt(spec)

    assert endpoint is not None and endpoint.port == lost["port"]
    assert pgids(backend.get_state()) == pgids(lost)
    assert backend.poll().running
    wait_for(lambda: "up" in log_text(backend))
    backend.stop(grace_s=1)
    assert all(group_members(pgid) == [] for pgid in pgids(lost))
    assert backend.poll() == Status("exited", STOPPED_EXIT_CODE, "stopped on request")


def test_an_adopted_job_that_ended_polls_its_exit_code(place: Place, made: list[LocalBackend]):
    spec = place.spec("echo PROGRESS 0.5; echo result > artifacts/out.txt; exit 7")
    lost = place.start_in_dying_worker(spec)
    wait_for(all_ended(lost))  # it ended after its worker died, with nobody to see it

    backend = place.backend(made)
    assert backend.adopt(spec) is not None

    assert backend.poll() == Status("exited", 7, "exited with code 7")
    assert log_text(backend).startswith("PROGRESS 0.5")
    progress = backend.progress()
    assert progress is not None and progress.fraction == 0.5
    assert [artifact.path for artifact in backend.artifacts().files] == ["artifacts/out.txt"]
    backend.stop()  # a no-op on what ended
    # Until the portal records it, another takeover finds it just the same.
    assert place.backend(made).adopt(spec) is not None


def test_a_replica_killed_from_outside_ends_with_the_unknown_exit_code(place: Place, made: list[LocalBackend]):
    spec = place.spec("sleep 100")
    lost = place.start_in_dying_worker(spec)
    pgid = pgids(lost)[0]
    assert pgid > 1  # killpg(1) or less would reach far more than the job
    os.killpg(pgid, signal.SIGKILL)  # the wrapper too: no status file is written
    wait_for(all_ended(lost))

    backend = place.backend(made)
    assert backend.adopt(spec) is not None
    assert backend.poll().exit_code == UNKNOWN_EXIT_CODE


def test_it_adopts_only_under_the_spec_key(place: Place, made: list[LocalBackend]):
    lost = place.start_in_dying_worker(place.spec("sleep 100", key="job-1"))

    other = place.backend(made)
    assert other.adopt(place.spec("sleep 100", key="job-2")) is None
    assert other.get_state() == {}
    assert all(group_members(pgid) for pgid in pgids(lost))  # what it did not adopt, it left alone
    assert place.backend(made).adopt(place.spec("sleep 100", key="job-1")) is not None


def test_it_adopts_a_gang_as_a_whole(place: Place, made: list[LocalBackend]):
    spec = place.spec('echo "rank $RANK of $WORLD_SIZE"; sleep 100', replicas=2, devices=[["0"], ["1"]])
    lost = place.start_in_dying_worker(spec)

    backend = place.backend(made)
    assert backend.adopt(spec) is not None

    assert pgids(backend.get_state()) == pgids(lost)
    wait_for(lambda: log_text(backend, 0).strip() == "rank 0 of 2" and log_text(backend, 1).strip() == "rank 1 of 2")
    assert backend.poll().running
    backend.stop(grace_s=1)
    assert all(group_members(pgid) == [] for pgid in pgids(lost))
    assert not backend.poll().running


def test_a_gang_started_in_part_is_stopped_not_adopted(place: Place, made: list[LocalBackend]):
    spec = place.spec("sleep 100", replicas=2)
    lost = place.start_in_dying_worker(spec, die_at_rank=1)  # rank 0 runs, rank 1 never started
    assert len(lost["replicas"]) == 1 and group_members(pgids(lost)[0])

    backend = place.backend(made)
    assert backend.adopt(spec) is None

    assert backend.get_state() == {}
    assert group_members(pgids(lost)[0]) == []  # the start that follows runs the gang alone
    assert place.backend(made).adopt(spec) is None


def test_a_replica_spawned_but_never_recorded_runs_nothing_and_the_next_start_runs_the_command_once(
    place: Place, made: list[LocalBackend]
):
    spec = place.spec('echo ran >> "$HOME/ran"; sleep 1')  # HOME: the job's directory
    lost = place.start_in_dying_worker(spec, die_after_rank=0)  # spawned; the record names no replica
    assert lost["replicas"]

    backend = place.backend(made)
    assert backend.adopt(spec) is None  # what the record does not name cannot be taken over
    backend.start(spec)
    assert wait_exit(backend) == Status("exited", 0, "exited")
    wait_for(lambda: not [p for p in pgids(lost) if group_members(p)])  # the unrecorded wrapper is gone
    assert (place.owner / "ws" / "job-1" / "ran").read_text().split() == ["ran"]  # run once, not twice


def test_a_start_on_other_devices_is_stopped_not_adopted(place: Place, made: list[LocalBackend]):
    lost = place.start_in_dying_worker(place.spec("sleep 100", devices=[["0"]]))

    assert place.backend(made).adopt(place.spec("sleep 100", devices=[["1"]])) is None
    assert group_members(pgids(lost)[0]) == []


def test_it_adopts_an_instance(place: Place, made: list[LocalBackend]):
    spec = InstanceSpec(key="instance-1", workspace="ws", name="box", work_dir=str(place.owner / "ws"))
    lost = place.start_in_dying_worker(spec)

    backend = place.backend(made)
    assert backend.adopt(place.spec("sleep 100", key="instance-1")) is None  # not a job
    assert backend.adopt(spec) is not None

    assert backend.get_state()["kind"] == "instance" and backend.poll().running
    backend.stop(grace_s=1)
    assert group_members(pgids(lost)[0]) == []


def test_a_recorded_start_is_never_adopted_and_the_next_start_runs_afresh(place: Place, made: list[LocalBackend]):
    first = place.backend(made)
    first.start(place.spec("exit 3"))
    assert wait_exit(first).exit_code == 3
    assert place.backend(made).adopt(place.spec("exit 3")) is not None  # not recorded yet

    place.backend(made).load_state(json.loads(json.dumps(first.get_state())))  # the portal reattaches

    assert place.backend(made).adopt(place.spec("exit 3")) is None
    again = place.backend(made)
    again.start(place.spec("echo second; exit 0"))  # the job's next attempt, under the same key
    assert wait_exit(again) == Status("exited", 0, "exited")
    assert log_text(again) == "second\n"


def test_a_start_given_up_or_swept_is_never_adopted(place: Place, made: list[LocalBackend]):
    given_up = place.backend(made)
    given_up.start(place.spec("sleep 100", key="job-1"))
    swept = place.start_in_dying_worker(place.spec("sleep 100", key="job-2"))
    assert place.backend(made).adopt(place.spec("sleep 100", key="job-1")) is not None

    given_up.stop(grace_s=1)  # a failed start: stopped, then cleared, as the contract asks
    given_up.clear_state()
    assert place.backend(made).sweep_orphans(str(place.owner), Keep(keys=frozenset({"job-1"}))) == ["job-2"]
    wait_for(all_ended(swept))

    assert place.backend(made).adopt(place.spec("sleep 100", key="job-1")) is None
    assert place.backend(made).adopt(place.spec("sleep 100", key="job-2")) is None
