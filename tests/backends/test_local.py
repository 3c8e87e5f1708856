"""The local backend, for real: bash processes, /proc, log files. No mocks, no database."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.backends import BackendError, GpuInfo, JobSpec, PolicyRefusal, Status
from workers.backends.base import TIMEOUT_EXIT_CODE
from workers.backends.local import LocalBackend, parse_nvidia_smi

DEADLINE_S = 15.0


def wait_for(check: Callable[[], Any], timeout: float = DEADLINE_S) -> Any:
    """Poll ``check`` until it returns something truthy; fail at the deadline, never sleep blindly."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.02)


def wait_exit(backend: LocalBackend) -> Status:
    def exited() -> Status | None:
        status = backend.poll()
        return None if status.running else status

    result: Status = wait_for(exited)
    return result


def log_text(backend: LocalBackend, replica: int = 0) -> str:
    return backend.logs(replica)[0].decode()


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``, read straight from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def pgids(backend: LocalBackend) -> list[int]:
    return [r["pgid"] for r in backend.get_state()["replicas"]]


@pytest.fixture
def make_spec(tmp_path: Path) -> Callable[..., JobSpec]:
    def make(command: str, **kwargs: Any) -> JobSpec:
        fields: dict[str, Any] = {"key": "job-1", "workspace": "ws", "name": "test", "work_dir": str(tmp_path)}
        fields.update(kwargs)
        return JobSpec(command=command, **fields)

    return make


@pytest.fixture
def backends() -> Iterator[list[LocalBackend]]:
    """Backends a test started; whatever a failing test left running is killed."""
    started: list[LocalBackend] = []
    yield started
    for backend in started:
        if backend.get_state():
            backend.stop(grace_s=0)


def start(backends: list[LocalBackend], spec: JobSpec, **settings: Any) -> LocalBackend:
    backend = LocalBackend(teardown_grace_s=settings.pop("teardown_grace_s", 1.0), **settings)
    backend.start(spec)
    backends.append(backend)
    return backend


def test_it_gives_each_replica_exactly_its_devices(backends: list[LocalBackend], make_spec: Any, monkeypatch: Any):
    monkeypatch.setenv("PORTAL_TEST_SECRET", "do-not-leak")
    spec = make_spec(
        'echo "CVD=$CUDA_VISIBLE_DEVICES secret=${PORTAL_TEST_SECRET:-none} GREETING=$GREETING cwd=$PWD"',
        replicas=2,
        devices=[["0", "1"], ["1"]],
        env={"GREETING": "hi"},
    )
    backend = start(backends, spec)

    assert wait_exit(backend).exit_code == 0
    job_dir = Path(spec.work_dir, spec.key)
    assert log_text(backend, 0).strip() == f"CVD=0,1 secret=none GREETING=hi cwd={job_dir}"
    assert log_text(backend, 1).strip() == f"CVD=1 secret=none GREETING=hi cwd={job_dir}"


def test_it_gives_a_gang_consistent_rendezvous_variables(backends: list[LocalBackend], make_spec: Any):
    spec = make_spec('echo "$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT"', replicas=3)
    backend = LocalBackend()
    endpoint = backend.start(spec)
    backends.append(backend)

    assert wait_exit(backend).exit_code == 0
    lines = [log_text(backend, rank).split() for rank in range(3)]
    assert [line[0] for line in lines] == ["0", "1", "2"]
    assert {tuple(line[1:]) for line in lines[:1]} == {("3", "0", "127.0.0.1", str(endpoint.port))}
    assert {(line[1], line[3], line[4]) for line in lines} == {("3", "127.0.0.1", str(endpoint.port))}
    assert endpoint.host == "127.0.0.1"


def test_it_serves_logs_while_running(backends: list[LocalBackend], make_spec: Any):
    spec = make_spec("echo first; while [ ! -f go ]; do sleep 0.02; done; echo second >&2")
    backend = start(backends, spec)

    first, offset = wait_for(lambda: (lambda r: r if r[0] else None)(backend.logs(0, 0)))
    assert first == b"first\n"
    assert backend.poll().running
    assert backend.logs(0, offset) == (b"", offset)

    Path(spec.work_dir, spec.key, "go").touch()
    assert wait_exit(backend).exit_code == 0
    assert backend.logs(0, offset) == (b"second\n", offset + 7)


def test_it_keeps_artifacts_with_their_sha256(backends: list[LocalBackend], make_spec: Any):
    spec = make_spec(
        'printf hello > "$PORTAL_ARTIFACTS_DIR/a.txt"; mkdir -p out/sub; printf weights > out/sub/model.bin;'
        " printf x > scratch.txt; ln -s /etc/hostname artifacts/escape; exit 0",
        artifact_paths=["artifacts", "out"],
    )
    backend = start(backends, spec)
    assert wait_exit(backend).exit_code == 0

    assert backend.artifacts().files == [
        ("artifacts/a.txt", 5, hashlib.sha256(b"hello").hexdigest()),
        ("out/sub/model.bin", 7, hashlib.sha256(b"weights").hexdigest()),
    ]


def test_it_refuses_artifact_paths_and_env_keys_a_user_must_fix(make_spec: Any):
    for bad in ({"artifact_paths": ["../elsewhere"]}, {"artifact_paths": ["/etc"]}, {"env": {"1BAD": "x"}}):
        with pytest.raises(PolicyRefusal):
            LocalBackend().start(make_spec("true", **bad))
    with pytest.raises(PolicyRefusal, match="set by the portal"):
        LocalBackend().start(make_spec("true", env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}))
    with pytest.raises(BackendError) as excinfo:
        LocalBackend().start(make_spec("true", replicas=2, devices=[["0"]]))
    assert excinfo.value.permanent


def test_it_propagates_the_exit_code(backends: list[LocalBackend], make_spec: Any):
    backend = start(backends, make_spec("exit 3"))

    status = wait_exit(backend)
    assert (status.state, status.exit_code) == ("exited", 3)
    assert backend.poll() == status


def test_a_failing_replica_tears_the_gang_down(backends: list[LocalBackend], make_spec: Any):
    spec = make_spec('if [ "$RANK" = 1 ]; then exit 7; fi; sleep 100', replicas=3)
    backend = start(backends, spec)

    status = wait_exit(backend)
    assert status.exit_code == 7
    assert "replica 1 exited with code 7" in status.message
    assert all(group_members(pgid) == [] for pgid in pgids(backend))


def test_it_kills_a_job_past_its_max_runtime(backends: list[LocalBackend], make_spec: Any):
    backend = start(backends, make_spec("sleep 100", max_runtime_s=0.3))

    status = wait_exit(backend)
    assert status.exit_code == TIMEOUT_EXIT_CODE
    assert "max runtime" in status.message
    assert group_members(pgids(backend)[0]) == []


def test_stop_leaves_no_process_behind(backends: list[LocalBackend], make_spec: Any):
    # Rank 1 ignores SIGTERM (and so do the children it starts): only SIGKILL after the grace ends it.
    spec = make_spec(
        'if [ "$RANK" = 1 ]; then trap "" TERM; fi; sleep 100 & sleep 100 & echo started; sleep 100', replicas=2
    )
    backend = start(backends, spec)
    wait_for(lambda: all("started" in log_text(backend, r) for r in range(2)))
    wait_for(lambda: all(len(group_members(pgid)) >= 4 for pgid in pgids(backend)))  # wrapper + 3 sleeps

    backend.stop(grace_s=0.3)

    assert all(group_members(pgid) == [] for pgid in pgids(backend))
    status = backend.poll()
    assert status.state == "exited" and status.message == "stopped on request"
    assert backend.get_state()["killed"]["signal"] == signal.SIGKILL  # rank 1 needed the escalation
    backend.stop(grace_s=0.3)  # idempotent


def test_a_new_backend_reattaches_from_the_saved_state(backends: list[LocalBackend], make_spec: Any):
    backend = start(backends, make_spec("echo up; while [ ! -f go ]; do sleep 0.02; done; exit 5", key="a"))
    lingering = start(backends, make_spec("echo up; sleep 100", key="b"))
    wait_for(lambda: "up" in log_text(backend) and "up" in log_text(lingering))

    # The worker "restarts": only the JSON blobs on the rows survive.
    revived, revived_lingering = LocalBackend(), LocalBackend()
    revived.load_state(json.loads(json.dumps(backend.get_state())))
    revived_lingering.load_state(json.loads(json.dumps(lingering.get_state())))
    backends.extend([revived, revived_lingering])

    assert revived.poll().running and revived_lingering.poll().running
    assert revived.logs(0) == (b"up\n", 3)
    Path(revived.get_state()["job_dir"], "go").touch()
    assert wait_exit(revived).exit_code == 5  # read from the status file: the revived one is not the parent

    revived_lingering.stop(grace_s=1)
    assert group_members(pgids(revived_lingering)[0]) == []
    assert not revived_lingering.poll().running


def test_it_parses_progress_lines(backends: list[LocalBackend], make_spec: Any):
    backend = start(
        backends,
        make_spec(
            "echo warming up; while [ ! -f go ]; do sleep 0.02; done; echo PROGRESS 0.25;"
            " echo PROGRESS 0.42; echo loss=1.3"
        ),
    )
    wait_for(lambda: "warming" in log_text(backend))
    assert backend.progress() is None

    Path(backend.get_state()["job_dir"], "go").touch()
    wait_exit(backend)
    progress = backend.progress()
    assert progress is not None and progress.fraction == pytest.approx(0.42)


def test_start_is_idempotent_while_running_and_refused_after(backends: list[LocalBackend], make_spec: Any):
    spec = make_spec("while [ ! -f go ]; do sleep 0.02; done")
    backend = start(backends, spec)
    first_pids = pgids(backend)

    assert backend.start(spec).port == backend.get_state()["port"]
    assert pgids(backend) == first_pids
    Path(spec.work_dir, spec.key, "go").touch()
    wait_exit(backend)
    with pytest.raises(BackendError):
        backend.start(spec)


def test_it_discovers_the_declared_inventory_or_nvidia_smi():
    gpus = [GpuInfo(index="0", name="declared", memory_mb=16384)]
    assert LocalBackend(inventory=gpus).discover() == gpus
    out = "0, NVIDIA H100 80GB HBM3, 81559, GPU-abc\n1, NVIDIA H100 80GB HBM3, 81559, GPU-def\n"
    assert [(g.index, g.memory_mb, g.uuid) for g in parse_nvidia_smi(out)] == [
        ("0", 81559, "GPU-abc"),
        ("1", 81559, "GPU-def"),
    ]
