"""The sandbox every local workload runs in: bubblewrap (``bwrap``), as its workspace's account.

What a sandboxed process sees (see docs/security.md for the threat model):

- **Files**: the system's read-only directories (``/usr``, ``/etc``, ``/opt``, ``/sys``, the
  Python it runs on), the read-only paths its workload needs (its notebook environment), its workspace's
  directory read-write, a private ``/tmp`` and ``/dev/shm``. Nothing else exists for it: not the
  portal's data directory, database, logs or secret key, not another workspace's directory.
- **Network**: the machine's, or, where asked (``private_network``), a namespace of its own with
  only loopback.
- **Processes**: its own PID namespace (``--unshare-pid``), so no other process on the machine is
  visible or can be signalled; its own IPC and UTS namespaces.
- **Devices**: a minimal ``/dev`` plus exactly its own GPUs' device nodes (``/dev/nvidia<N>``)
  and the driver's control nodes, not merely ``CUDA_VISIBLE_DEVICES``.
- **Environment**: only what the caller passes (the workload's variables), never the portal's.
  The variables reach bubblewrap through a file descriptor, not its command line, and the
  wrapper outside the sandbox, which runs as the portal, never sees them: a variable such as
  ``BASH_ENV`` or ``LD_PRELOAD`` must not act on a process with the portal's rights.
- **Identity**: when the portal runs as root, the workload runs as its workspace's own Unix
  account (``setpriv`` drops to it inside the sandbox, with no capabilities and
  ``no_new_privs``); as an ordinary user, bubblewrap puts it in a user namespace of its own.
- **No user namespaces of its own**: a seccomp filter (:func:`no_userns_filter`) makes
  ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` fail (``EPERM``), and ``clone3`` too
  (``ENOSYS``, whose flags a filter cannot read; the C library then falls back to ``clone``). In a
  user namespace of its own a process holds every capability over the namespaces it makes, which
  opens much of the kernel (mounts, netfilter, ...) to unprivileged code: the surface most
  namespace escapes go through. Where bubblewrap makes the sandbox's own user namespace (an
  ordinary user's portal), ``--disable-userns`` says the same.

**Lifetime.** The sandbox is started by the workload's wrapper, a small shell that leads its own
session outside the sandbox and records the exit status: the wrapper, not the portal's worker, is
bubblewrap's parent, so a portal restart leaves running work alone and reattaches to it (by the
wrapper's pid). ``--die-with-parent`` ties the sandbox to the wrapper: when the wrapper is killed,
every process in the sandbox dies with it, even one that left the process group. Stopping a
workload sends SIGTERM to the processes inside (:func:`is_sandbox_process` tells them apart), so
the workload gets its grace period, and SIGKILL to the whole group after it.
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from workers.backends.base import BackendError, RunAs

#: Read-only system directories bound into every sandbox, where they exist.
SYSTEM_DIRS = ("/usr", "/etc", "/opt")
#: Merged-/usr symlinks, recreated inside the sandbox (Debian and Ubuntu have them).
USR_LINKS = {"/bin": "usr/bin", "/sbin": "usr/sbin", "/lib": "usr/lib", "/lib64": "usr/lib64", "/lib32": "usr/lib32"}
#: The NVIDIA driver's shared device nodes: every GPU workload needs them as well as its own GPUs'.
NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
#: The flag of unshare(2) and clone(2) that makes a user namespace (``os.CLONE_NEWUSER``, Python 3.12+).
CLONE_NEWUSER = 0x10000000


@dataclass
class Sandbox:
    """How to wrap one workload's command: ``argv(command)`` gives what the wrapper execs.

    ``writable`` are bound read-write (the workspace's directory), ``read_only`` read-only (its
    environment, the notebook identity module); ``devices`` are GPU indices; ``run_as`` the
    account to drop to (only when the portal runs as root); ``cwd`` the directory it starts in.
    ``private_network``: a network namespace of its own with only loopback (``--unshare-net``), so
    no process outside can reach a port it listens on, and it reaches nothing but itself (a Ray
    cluster's nodes: workers/backends/raycluster.py); off, it shares the machine's network.
    """

    writable: list[str]
    read_only: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    run_as: RunAs | None = None
    cwd: str = "/"
    bwrap: str = "bwrap"
    dev_root: str = "/dev"
    private_network: bool = False

    def env_args(self, env: dict[str, str]) -> bytes:
        """bubblewrap's options giving the sandbox exactly ``env`` (and nothing of its parent's),
        NUL-separated, for ``--args FD``: the values stay out of every process's command line,
        which any account on the machine can read."""
        options = ["--clearenv"]
        for key, value in env.items():
            options += ["--setenv", key, value]
        return b"".join(option.encode() + b"\0" for option in options)

    def argv(self, command: str, args_fd: int | None = None, seccomp_fd: int | None = None) -> list[str]:
        """bubblewrap's argv running ``bash -c command`` inside the sandbox; ``args_fd`` is a file
        descriptor holding :meth:`env_args`, read by bubblewrap before it starts the command, and
        ``seccomp_fd`` one holding :func:`no_userns_filter`, which the command runs under."""
        args = [self.bwrap, *(["--args", str(args_fd)] if args_fd is not None else [])]
        args += ["--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        args.append("--unshare-cgroup-try")
        if self.private_network:
            args.append("--unshare-net")  # bubblewrap brings its loopback up
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        if os.geteuid() != 0:
            args.append("--unshare-user")
            if "--disable-userns" in _bwrap_options(self.bwrap):
                args.append("--disable-userns")
        args += ["--hostname", "sandbox"]
        for path in _existing(SYSTEM_DIRS):
            args += ["--ro-bind", path, path]
        for link, target in USR_LINKS.items():
            if os.path.islink(link):
                args += ["--symlink", target, link]
            elif os.path.isdir(link):
                args += ["--ro-bind", link, link]
        # /sys read-only: the GPU driver's libraries (NVML, CUDA) read the PCI topology there.
        args += ["--proc", "/proc", "--dev", "/dev", "--ro-bind-try", "/sys", "/sys"]
        args += ["--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/var/tmp"]
        args += ["--perms", "1777", "--tmpfs", "/dev/shm"]
        for node in device_nodes(self.devices, self.dev_root):
            args += ["--dev-bind", node, node.replace(self.dev_root, "/dev", 1)]
        read_only = [p for p in _dedupe([*python_prefixes(), *self.read_only]) if os.path.exists(p)]
        writable = _dedupe(self.writable)
        # bubblewrap would give the directories it makes on the way to a bind the modes of the
        # host's (``/root`` is 0700): make them traversable, as they hold nothing but the binds.
        for parent in _parents([*read_only, *writable]):
            args += ["--perms", "0755", "--dir", parent]
        for path in read_only:
            args += ["--ro-bind", path, path]
        for path in writable:
            args += ["--bind", path, path]
        if os.geteuid() == 0 and self.run_as is None:
            args += ["--cap-drop", "ALL"]  # no account to drop to: at least no root powers inside
        args += ["--chdir", self.cwd, "--"]
        if self.run_as is not None and os.geteuid() == 0:
            args += [
                "setpriv",
                f"--reuid={self.run_as.uid}",
                f"--regid={self.run_as.gid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        return [*args, "bash", "-c", command]


def device_nodes(devices: Iterable[str], dev_root: str = "/dev") -> list[str]:
    """The device nodes of GPUs ``devices`` (indices) and the driver's control nodes, where
    present. A workload without GPUs gets none: it cannot open any GPU at all."""
    wanted = sorted({d for d in devices if d.isdigit()}, key=int)
    if not wanted:
        return []
    nodes = [f"{dev_root}/nvidia{d}" for d in wanted]
    nodes += [node.replace("/dev", dev_root, 1) for node in NVIDIA_CONTROL_NODES]
    caps = Path(dev_root, "nvidia-caps")
    if caps.is_dir():
        nodes.append(str(caps))
    return [n for n in nodes if os.path.exists(n)]


def python_prefixes() -> list[str]:
    """Where the interpreter behind the portal's virtualenvs lives: notebook environments link to
    it, so it is bound read-only (it is under /usr on a system Python, elsewhere with pyenv)."""
    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    return sorted(p for p in prefixes if not any(p == d or p.startswith(d + "/") for d in SYSTEM_DIRS))


def check_available(bwrap: str = "bwrap") -> str:
    """Return bubblewrap's path, or raise a permanent ``BackendError`` saying how to get it.

    A portal that cannot sandbox refuses to start user code (fail closed); the single-user
    opt-out is ``PORTAL_SANDBOX=off``. A sandbox includes its seccomp filter: without
    libseccomp (Debian's ``libseccomp2``) and ``pyseccomp`` there is none."""
    path = shutil.which(bwrap)
    if path is None:
        raise BackendError(
            "workloads cannot be sandboxed: bubblewrap (bwrap) is not installed. Install it "
            "(apt-get install bubblewrap; deploy/run.sh does this), or, on a single-user "
            "workstation only, set PORTAL_SANDBOX=off to run workloads unsandboxed.",
            permanent=True,
        )
    problem = _probe(path)
    if problem:
        raise BackendError(
            f"workloads cannot be sandboxed: bubblewrap cannot make a sandbox here ({problem}). Where the "
            "portal runs as an ordinary user, user namespaces must be enabled (sysctl "
            "kernel.unprivileged_userns_clone=1); in a container, allow them or run the portal as root.",
            permanent=True,
        )
    return path


@functools.lru_cache(maxsize=4)
def _probe(path: str) -> str:
    """'' when bubblewrap can make a sandbox like the workloads' (namespaces, binds, the seccomp
    filter), else why not."""
    argv = [path, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--ro-bind", "/", "/", "--proc", "/proc"]
    if os.geteuid() != 0:
        argv.append("--unshare-user")
    try:
        seccomp_fd = filter_fd()
    except BackendError as exc:
        return str(exc)
    try:
        done = subprocess.run(
            [*argv, "--seccomp", str(seccomp_fd), "--", "true"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
            pass_fds=(seccomp_fd,),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    finally:
        os.close(seccomp_fd)
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit status {done.returncode}")[-300:]


def filter_fd() -> int:
    """A new file descriptor holding :func:`no_userns_filter`, positioned at its start, for
    bubblewrap's ``--seccomp`` (which reads it once); the caller closes it."""
    fd = os.memfd_create("portal-sandbox-seccomp")
    os.write(fd, no_userns_filter())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


#: The other instruction sets a machine's kernel may run (32-bit programs): the filter covers
#: them too, rather than letting libseccomp's default kill every process that uses them.
_COMPAT_ARCHES = {"x86_64": ("X86",), "aarch64": ("ARM",)}


@functools.lru_cache(maxsize=1)
def no_userns_filter() -> bytes:
    """The seccomp program every sandboxed workload runs under, as classic BPF (what bubblewrap's
    ``--seccomp`` reads): ``unshare`` and ``clone`` asking for ``CLONE_NEWUSER`` fail with
    ``EPERM``, ``clone3`` with ``ENOSYS`` (so the C library falls back to ``clone``, whose flags
    the filter can read); every other call is allowed. ``BackendError(permanent=True)`` where
    libseccomp or its bindings are missing."""
    try:
        import pyseccomp  # type: ignore[import-untyped]  # (no type hints shipped)
    except (ImportError, RuntimeError) as exc:  # RuntimeError: the bindings found no libseccomp
        raise BackendError(
            f"workloads cannot be sandboxed: no seccomp filter can be built ({exc}). Install libseccomp "
            "(apt-get install libseccomp2) and the pinned requirements (pyseccomp).",
            permanent=True,
        ) from exc
    rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for arch in _COMPAT_ARCHES.get(platform.machine(), ()):
        rules.add_arch(getattr(pyseccomp.Arch, arch))
    refused = pyseccomp.ERRNO(errno.EPERM)
    # clone(2)'s flags are its first argument, but on s390 (CLONE_BACKWARDS2) its second.
    clone_flags = 1 if platform.machine().startswith("s390") else 0
    rules.add_rule(refused, "unshare", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    rules.add_rule(refused, "clone", pyseccomp.Arg(clone_flags, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    rules.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as program:
        rules.export_bpf(program)
        program.seek(0)
        return program.read()


@functools.lru_cache(maxsize=4)
def _bwrap_options(bwrap: str) -> str:
    """bubblewrap's ``--help`` (its options), '' where it cannot be run."""
    try:
        return subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _parents(paths: Iterable[str]) -> list[str]:
    """The ancestors of ``paths`` outside the system directories, top first, each once."""
    found: list[str] = []
    for path in paths:
        parts = Path(path).parts
        for i in range(2, len(parts)):
            parent = str(Path(*parts[:i]))
            inside_system = any(parent == d or parent.startswith(d + "/") for d in SYSTEM_DIRS)
            if not inside_system and parent not in found:
                found.append(parent)
    return found


def _existing(paths: Iterable[str]) -> list[str]:
    return [p for p in paths if os.path.isdir(p) and not os.path.islink(p)]


def _dedupe(paths: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for path in paths:
        real = os.path.realpath(path)
        if real not in seen:
            seen.append(real)
    return seen
