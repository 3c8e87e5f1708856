"""Ways out of a local workload's sandbox that its namespaces alone leave open, tried for real.

- **User namespaces**: in one of its own, a process holds every capability over the namespaces it
  makes, which opens much of the kernel to unprivileged code. A seccomp filter refuses them
  (``unshare``/``clone`` with ``CLONE_NEWUSER``: EPERM; ``clone3``: ENOSYS), as root with the
  workspace's account, as root with no account, and in an ordinary user's portal; ordinary programs
  (threads, subprocesses, fork) still run.
- **The portal's environment**: its PATH (its account's home, its virtualenv) and its work
  directory never reach a workload; the wrapper outside the sandbox keeps what finding the
  workload again needs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyseccomp  # type: ignore[import-untyped]
import pytest

from tests.security.test_sandbox import finished, wait_for
from workers.backends import BackendError, JobSpec, sandbox
from workers.backends.base import Keep, RunAs
from workers.backends.local import LocalBackend

NOBODY = RunAs("nobody", 65534, 65534)

# Run inside a job: how each way to a user namespace ends, then whether ordinary programs run.
PROBE = r"""
import ctypes, errno, os, platform, subprocess, sys, threading

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17
SYS_CLONE = {"x86_64": 56, "aarch64": 220}[platform.machine()]
SYS_CLONE3 = 435

def outcome(result):
    return "allowed" if result >= 0 else errno.errorcode[ctypes.get_errno()]

def py_unshare():
    try:
        os.unshare(os.CLONE_NEWUSER)
        return "allowed"
    except OSError as exc:
        return errno.errorcode[exc.errno]

def clone():
    child = libc.syscall(SYS_CLONE, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
    if child == 0:
        os._exit(0)
    if child > 0:
        os.waitpid(child, 0)
    return outcome(child)

def attempt(name, call):
    # Each in a process of its own: one that got a user namespace could not make the next.
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        print(name, call(), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)

attempt("unshare", lambda: outcome(libc.unshare(CLONE_NEWUSER)))
if hasattr(os, "unshare"):  # Python 3.12+
    attempt("os.unshare", py_unshare)
attempt("clone", clone)
attempt("clone3", lambda: outcome(libc.syscall(SYS_CLONE3, 0, 0)))  # no arguments: EINVAL if let through

ran = []
thread = threading.Thread(target=lambda: ran.append("thread"))
thread.start()
thread.join()
ran.append(subprocess.run(["echo", "subprocess"], capture_output=True, text=True).stdout.strip())
pid = os.fork()
if pid == 0:
    os._exit(7)
ran.append(f"fork {os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}")
print("ran", ", ".join(ran))
"""
COMMAND = 'unshare -U true 2>/dev/null; echo "unshare-command $?"; python3 -c "$PROBE"'
REFUSED = {
    "unshare-command": "1",
    "unshare": "EPERM",
    "clone": "EPERM",
    "clone3": "ENOSYS",
    "ran": "thread, subprocess, fork 7",
}


def outcomes(log: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in log.strip().splitlines())


@pytest.mark.skipif(os.geteuid() != 0, reason="a portal that runs as root: its workloads run as their accounts")
@pytest.mark.parametrize("run_as", [NOBODY, None], ids=["workspace-account", "no-account"])
def test_a_job_cannot_make_a_user_namespace(tmp_path: Path, started: list[LocalBackend], run_as: RunAs | None) -> None:
    backend = LocalBackend()
    started.append(backend)
    spec = JobSpec(key="job-1", workspace="ws", name="x", command=COMMAND, work_dir=str(tmp_path / "ws"),
                   env={"PROBE": PROBE}, run_as=run_as)  # fmt: skip
    backend.start(spec)

    log = finished(backend)

    found = outcomes(log)
    assert {name: found.get(name) for name in REFUSED} == REFUSED, log
    assert found.get("os.unshare", "EPERM") == "EPERM"


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming an ordinary user needs root")
def test_a_job_of_an_ordinary_users_portal_cannot_make_another_user_namespace(request: Any) -> None:
    """The portal runs as an ordinary user: bubblewrap gives the sandbox a user namespace of its
    own, and neither its filter nor ``--disable-userns`` lets the job make another."""
    workspace = Path(tempfile.mkdtemp(prefix="gpuportal-userns-"))  # pytest's own are private to root
    os.chown(workspace, NOBODY.uid, NOBODY.gid)
    request.addfinalizer(lambda: shutil.rmtree(workspace, ignore_errors=True))
    # The checkout may sit where an ordinary user cannot read it: the sandbox's code goes along.
    code = Path(tempfile.mkdtemp(prefix="gpuportal-userns-code-"))
    request.addfinalizer(lambda: shutil.rmtree(code, ignore_errors=True))
    shutil.copytree(Path(__file__).resolve().parents[2] / "workers", code / "workers", dirs_exist_ok=True)
    shutil.copy(pyseccomp.__file__, code)
    code.chmod(0o755)
    script = (
        "import subprocess, sys\n"
        "from workers.backends.sandbox import Sandbox, filter_fd\n"
        "seccomp = filter_fd()\n"
        "argv = Sandbox(writable=[sys.argv[1]], cwd=sys.argv[1]).argv(sys.argv[2], seccomp_fd=seccomp)\n"
        "assert '--unshare-user' in argv and '--disable-userns' in argv, argv\n"
        "done = subprocess.run(argv, capture_output=True, text=True, pass_fds=(seccomp,))\n"
        "print(done.stdout, done.stderr)\n"
    )
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script]
    done = subprocess.run(
        [*as_nobody, str(workspace), COMMAND], capture_output=True, text=True,
        env={"PYTHONPATH": str(code), "PROBE": PROBE, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip

    found = outcomes(done.stdout)
    assert {name: found.get(name) for name in REFUSED} == REFUSED, done.stdout + done.stderr


@pytest.mark.parametrize("sandbox", ["bwrap", "off"])
def test_a_job_gets_neither_the_portals_path_nor_its_work_directory(
    tmp_path: Path, started: list[LocalBackend], monkeypatch: Any, sandbox: str
) -> None:
    portal_path = f"/root/.local/bin:{Path(sys.executable).parent}:/usr/bin:/bin"
    monkeypatch.setenv("PATH", portal_path)  # the portal's own: its account's and its virtualenv's
    owner = tmp_path / "portal-work"
    backend = LocalBackend(owner=str(owner), sandbox=sandbox)
    started.append(backend)
    command = 'echo "PATH=$PATH"; echo "PORTAL_OWNER=${PORTAL_OWNER-unset}"; echo ready; sleep 100'
    spec = JobSpec(key="job-1", workspace="ws", name="x", command=command, work_dir=str(owner / "ws"))
    backend.start(spec)
    log = wait_for(lambda: (lambda text: text if "ready" in text else None)(backend.logs(0)[0].decode()))

    variables = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
    assert variables["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert variables["PORTAL_OWNER"] == "unset"
    # The wrapper, outside the sandbox, keeps them: what finds a workload no one recorded.
    wrapper = backend.get_state()["replicas"][0]["pid"]
    assert f"PORTAL_OWNER={owner}".encode() in Path(f"/proc/{wrapper}/environ").read_bytes().split(b"\0")
    assert backend.sweep_orphans(str(owner), Keep()) == ["job-1"]
    wait_for(lambda: not backend.poll().running)


def test_a_portal_that_cannot_build_the_filter_starts_no_workload(
    tmp_path: Path, monkeypatch: Any, request: Any
) -> None:
    """Fail closed: without libseccomp's bindings there is no filter, so no sandbox, so nothing runs."""
    for cached in (sandbox.no_userns_filter, sandbox._probe):
        cached.cache_clear()
        request.addfinalizer(cached.cache_clear)
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # what an import of a missing module meets
    backend = LocalBackend()

    with pytest.raises(BackendError) as refused:
        backend.start(JobSpec(key="job-1", workspace="ws", name="x", command="true", work_dir=str(tmp_path)))

    assert refused.value.permanent and "no seccomp filter can be built" in str(refused.value)
    assert backend.get_state() == {}
