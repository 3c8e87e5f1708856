"""The sandbox's own guarantees, on the local backend: fail closed, only its own GPUs, a grace
period on stop, a private data directory."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from portal.embedded import sandbox_problem, secure_data_dir
from tests.personas import World
from workers.backends import BackendError, JobSpec
from workers.backends.local import LocalBackend
from workers.backends.sandbox import device_nodes


def wait_for(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
    return result


def finished(backend: LocalBackend) -> str:
    wait_for(lambda: not backend.poll().running)
    return backend.logs(0)[0].decode()


def test_it_refuses_to_start_user_code_where_bubblewrap_is_missing(
    world: World, settings: Any, tmp_path: Path, monkeypatch: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.PORTAL_WORKLOAD_TRIGGER = "inline"
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it

    with django_capture_on_commit_callbacks(execute=True):
        job = check_submit_job(
            world.team_a, name="job", command="echo ran", acting_user=world.alice, gpu_type="h100",
            gpus_per_replica=Decimal("1"),
        )  # fmt: skip

    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert "cannot be sandboxed: bubblewrap (bwrap) is not installed" in job.failure_reason
    assert "PORTAL_SANDBOX=off" in job.failure_reason
    assert not (tmp_path / "work" / "team-a" / f"job-{job.pk}").exists() or not any(
        (tmp_path / "work" / "team-a" / f"job-{job.pk}").iterdir()
    )


def test_the_embedded_portal_refuses_to_start_without_a_sandbox_and_says_why(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("PORTAL_SANDBOX", raising=False)
    assert "not installed" in sandbox_problem()

    monkeypatch.setenv("PORTAL_SANDBOX", "off")  # the explicit opt-out starts, with a warning
    assert sandbox_problem() == ""


def test_a_backend_without_bubblewrap_starts_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    backend = LocalBackend()
    with pytest.raises(BackendError) as refused:
        backend.start(JobSpec(key="job-1", workspace="ws", name="x", command="true", work_dir=str(tmp_path)))
    assert refused.value.permanent
    assert backend.get_state() == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="making device nodes needs root")
def test_a_gpu_job_sees_only_its_own_gpus_device_nodes(tmp_path: Path, started: list[LocalBackend]) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # stand-ins: /dev/null's numbers
    backend = LocalBackend(device_root=str(dev))
    started.append(backend)
    spec = JobSpec(
        key="job-1", workspace="ws", name="x", work_dir=str(tmp_path / "work"), devices=[["1", "3"]],
        command='ls /dev | grep nvidia | tr "\\n" " "; echo; echo "$CUDA_VISIBLE_DEVICES"',
    )  # fmt: skip
    backend.start(spec)

    visible, cvd = finished(backend).splitlines()

    assert visible.split() == ["nvidia-uvm", "nvidia1", "nvidia3", "nvidiactl"]
    assert cvd == "1,3"
    assert device_nodes([]) == []  # a CPU job gets no GPU device at all


def test_stop_gives_a_sandboxed_workload_its_grace_period(tmp_path: Path, started: list[LocalBackend]) -> None:
    backend = LocalBackend()
    started.append(backend)
    command = 'trap "sleep 0.3; echo checkpointed > saved.txt; exit 0" TERM; echo ready; while :; do sleep 0.05; done'
    backend.start(JobSpec(key="job-1", workspace="ws", name="x", command=command, work_dir=str(tmp_path)))
    wait_for(lambda: backend.logs(0)[0] == b"ready\n")

    backend.stop(grace_s=10)

    assert (tmp_path / "job-1" / "saved.txt").read_text() == "checkpointed\n"
    assert backend.poll().exit_code == 0


def test_the_data_directory_is_the_portals_alone(tmp_path: Path) -> None:
    data = tmp_path / "var"
    (data / "logs").mkdir(parents=True)
    (data / "work" / "team-a").mkdir(parents=True)
    for path in (data / "portal.sqlite3", data / "logs" / "web.log"):
        path.write_text("x")
        path.chmod(0o644)
    (data / "work" / "team-a").chmod(0o755)
    data.chmod(0o755)

    secure_data_dir(data)

    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "logs").stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "portal.sqlite3").stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "logs" / "web.log").stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "work" / "team-a").stat().st_mode) == 0o755  # the backends' to manage


@pytest.mark.parametrize("variable", ["BASH_ENV", "LD_PRELOAD"])
def test_a_workloads_variables_never_act_outside_its_sandbox(
    variable: str, tmp_path: Path, started: list[LocalBackend]
) -> None:
    """The wrapper outside the sandbox runs with the portal's rights: a variable that makes bash
    source a file (or the loader preload a library) must not reach it, nor any command line."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.sh").write_text(f"id -u >> {outside}/ran-as\n")
    value = str(outside / "evil.sh") if variable == "BASH_ENV" else str(outside / "missing.so")
    backend = LocalBackend()
    started.append(backend)
    spec = JobSpec(key="job-1", workspace="ws", name="x", command="echo started; sleep 1; echo done",
                   work_dir=str(tmp_path / "ws"), env={variable: value, "API_KEY": "team-a-secret-value"})  # fmt: skip
    backend.start(spec)
    wait_for(lambda: b"started" in backend.logs(0)[0])
    wrapper = backend.get_state()["replicas"][0]["pid"]
    cmdlines = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in [wrapper, *_group(wrapper)]]

    assert finished(backend).strip().endswith("done")
    assert not (outside / "ran-as").exists()
    assert not any(b"team-a-secret-value" in cmdline for cmdline in cmdlines)


def _group(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        try:
            stat_line = Path(f"/proc/{entry}/stat").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        if stat_line and int(stat_line[stat_line.rindex(")") + 2 :].split()[2]) == pgid:
            members.append(int(entry))
    return members


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming an ordinary user needs root")
def test_a_portal_run_by_an_ordinary_user_sandboxes_in_a_user_namespace(request: Any) -> None:
    """A researcher's workstation: the portal is not root, bubblewrap makes a user namespace."""
    workspace = Path(tempfile.mkdtemp(prefix="gpuportal-userns-"))  # pytest's own are private to root
    os.chown(workspace, 65534, 65534)
    request.addfinalizer(lambda: shutil.rmtree(workspace, ignore_errors=True))
    # The checkout may sit where an ordinary user cannot read it: the sandbox's code goes along.
    repo = Path(tempfile.mkdtemp(prefix="gpuportal-userns-code-"))
    request.addfinalizer(lambda: shutil.rmtree(repo, ignore_errors=True))
    shutil.copytree(Path(__file__).resolve().parents[2] / "workers", repo / "workers", dirs_exist_ok=True)
    repo.chmod(0o755)
    script = (
        "import subprocess, sys\n"
        "from workers.backends.sandbox import Sandbox\n"
        "command = 'id -u; ls /; ls /proc | grep -c \"^[0-9]\"; touch made-here'\n"
        "argv = Sandbox(writable=[sys.argv[1]], cwd=sys.argv[1]).argv(command)\n"
        "done = subprocess.run(argv, capture_output=True, text=True)\n"
        "print(done.stdout, done.stderr)\n"
    )
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script]
    done = subprocess.run([*as_nobody, str(workspace)], capture_output=True, text=True, env={"PYTHONPATH": str(repo)})

    lines = done.stdout.split()
    assert lines[0] == "65534", done.stdout + done.stderr
    assert "root" not in lines and "work" not in lines  # only the system's directories and its binds
    assert int(lines[-1]) <= 4  # bubblewrap's init, the shell, ls and grep: no other process
    assert (workspace / "made-here").exists()


def test_the_deployment_check_names_an_unsandboxed_portal(settings: Any) -> None:
    from apps.compute.checks import check_sandbox

    assert check_sandbox() == []
    settings.PORTAL_SANDBOX = "off"
    assert [message.id for message in check_sandbox()] == ["gpuportal.W001"]


@pytest.mark.skipif(os.geteuid() != 0, reason="about a portal that runs as root")
def test_a_sandbox_without_an_account_to_drop_to_keeps_no_root_powers(
    tmp_path: Path, started: list[LocalBackend]
) -> None:
    backend = LocalBackend()
    started.append(backend)
    command = "grep CapEff /proc/self/status; mount -t tmpfs none /tmp && echo mounted"
    backend.start(JobSpec(key="job-1", workspace="ws", name="x", command=command, work_dir=str(tmp_path)))

    log = finished(backend)

    assert "CapEff:\t0000000000000000" in log
    assert "mounted" not in log
