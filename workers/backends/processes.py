"""What the backends that run processes (local, Slurm) run for an instance and a notebook.

An instance is a holder (``sleep infinity``) with the instance's GPUs; a notebook a Jupyter server
from the profile's environment, at the root of the notebook's own host name behind the proxy,
letting in whom the portal allows (see workers/notebook). Both are then started as one-replica jobs,
with their ``portal_env``. The server runs nothing its workspace can write before the portal's own
code (``LAUNCHER``, ``server_command()``), and listens on a Unix socket that only its account and the
portal's can reach where the proxy runs on the same machine (the local backend: ``server_socket()``),
else on its node's address and a port (Slurm).

Every process a backend starts has a Python environment's ``bin`` first on its PATH (the
notebook's, or the SDK's own for jobs and instances: workers/backends/pyenv.py), so that
``python``, ``pip`` and the ``gpuportal`` CLI are that environment's."""

from __future__ import annotations

import hashlib
import http.client
import os
import shlex
import shutil
import socket
import stat
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path

from workers.backends.base import BackendError, InferenceSpec, InstanceSpec, JobSpec, NotebookSpec, RunAs, Spec
from workers.backends.pyenv import landing_path

# Where portal_identity.py lives: named by the server's PYTHONPATH, which the launcher below puts on
# sys.path itself (a backend that copies the module elsewhere points PYTHONPATH there).
IDENTITY_MODULES = Path(__file__).resolve().parent.parent / "notebook"

# The server runs in isolated mode (``python -I``): no PYTHON* variable acts, the user's
# site-packages are not read, and neither the working directory nor a script's directory is on
# sys.path (``python -m`` would put the working directory first: a ``portal_identity.py`` written
# there would be imported instead of the portal's). The launcher adds the one directory the portal
# names (its first argument, the portal's PYTHONPATH: absolute paths only, never an empty entry,
# which would mean the working directory) and hands over to the identity module, which
# makes the process non-dumpable before it starts the server.
LAUNCHER = (
    "import sys; sys.path[:0] = [p for p in sys.argv.pop(1).split(':') if p.startswith('/')]; "
    "import portal_identity; portal_identity.serve()"
)

# Where a Jupyter server reads its user's configuration and data (``~/.jupyter``,
# ``~/.local/share/jupyter``: configuration files are Python it runs, data holds the JupyterLab
# extensions it serves): no directory at all, so nothing can be put there. The configuration and
# data of the environment and of the system, which no workload can write, are read as ever.
# JupyterLab's user settings and workspaces (JSON it reads, and writes when a user changes them)
# and the notebook trust database and its key (``NOTARY_DIR``) stay where they were, in the job
# directory: data, never run.
NOTARY_DIR = "$HOME/.local/share/jupyter"
_SERVER_ENV = (
    "unset JUPYTER_PATH JUPYTER_CONFIG_PATH JUPYTER_PLATFORM_DIRS JUPYTER_PREFER_ENV_PATH && "
    "export JUPYTER_CONFIG_DIR=/dev/null JUPYTER_DATA_DIR=/dev/null "
    'JUPYTERLAB_SETTINGS_DIR="$HOME/.jupyter/lab/user-settings" '
    'JUPYTERLAB_WORKSPACES_DIR="$HOME/.jupyter/lab/workspaces" && '
    f'mkdir -p "{NOTARY_DIR}" && '
    # Kernels talk to the server over Unix sockets in a private directory of their own (0700,
    # named at random), not over loopback ports: no other process on the node can reach them, and
    # no port another server picks can turn out to be a kernel's.
    'export JUPYTER_RUNTIME_DIR="$(mktemp -d /tmp/jupyter-XXXXXXXX)" && '
)

#: The local backend's notebook servers listen on a Unix socket of this name (``server_socket()``).
SOCKET_NAME = "jupyter.sock"
#: The socket an inference replica's server listens on, beside where a notebook's would be.
INFERENCE_SOCKET_NAME = "server.sock"
#: The longest path a Unix socket can have (``sun_path`` holds 108 bytes, the last a NUL).
MAX_SOCKET_PATH = 107
UNIX_SCHEME = "http+unix"


def server_command(env_dir: Path, spec: NotebookSpec, *, ip: str = "", port: str = "", sock: str = "") -> str:
    """The shell command that runs the server, on the Unix socket ``sock`` or else on ``ip`` and
    ``port``, which are shell words, so that a batch script can expand them on the node it lands
    on (``$MASTER_PORT``). It starts in the environment's directory, which no workload writes."""
    listen = (
        [shlex.quote(f"--ServerApp.sock={sock}"), "--ServerApp.sock_mode=0600"]
        if sock
        # The portal routes to this port: taken by something else, fail rather than move.
        else [f"--ip={ip}", f"--port={port}", "--ServerApp.port_retries=0"]
    )
    args = [
        shlex.quote(f"{env_dir}/bin/python"),
        "-I",
        "-c",
        shlex.quote(LAUNCHER),
        '"$PYTHONPATH"',
        *listen,
        "--no-browser",
        shlex.quote(f"--ServerApp.base_url={spec.base_url}"),
        shlex.quote(f"--ServerApp.root_dir={Path(spec.work_dir).resolve()}"),
        # Its root opens JupyterLab, not the bare "A Jupyter Server is running" page.
        shlex.quote(f"--ServerApp.default_url={landing_path(env_dir)}"),
        # No "get notified about Jupyter news?" prompt: the server fetches nothing from outside.
        "--LabApp.news_url=None",
        # Behind the portal's proxy, which keeps the browser's Host header.
        "--ServerApp.allow_remote_access=True",
        # Every request is the portal's to allow (workers/notebook): the server's token, or the
        # session its sign-in handoff sets; the portal's URL for this notebook is no secret.
        "--ServerApp.identity_provider_class=portal_identity.PortalIdentityProvider",
        shlex.quote(f"--PortalIdentityProvider.portal_url={spec.auth_url}"),
        "--KernelManager.transport=ipc",
        f'"--NotebookNotary.data_dir={NOTARY_DIR}"',
    ]
    if os.geteuid() == 0:  # containers and CI often run as root; Jupyter refuses that by default
        args.append("--allow-root")
    return f"cd {shlex.quote(str(env_dir))} && " + _SERVER_ENV + "exec " + " ".join(args)


def install_identity(env_dir: Path) -> Path:
    """A copy of the identity module in the notebook environment ``env_dir``, for servers that run
    on other machines (Slurm's nodes see the environment on shared storage): the portal alone writes
    there, so no workspace can replace the module its server imports. Returns its directory."""
    target = env_dir / "share" / "gpuportal" / "identity"
    target.mkdir(parents=True, exist_ok=True)
    for module in sorted(IDENTITY_MODULES.glob("*.py")):
        text, dest = module.read_bytes(), target / module.name
        if not dest.is_file() or dest.read_bytes() != text:
            partial = target / f".{module.name}.{os.getpid()}"
            partial.write_bytes(text)
            partial.chmod(0o644)
            os.replace(partial, dest)
    for directory in (target.parent, target):
        directory.chmod(0o755)  # readable by every workspace's account, whatever the umask
    return target


def instance_job(spec: InstanceSpec) -> JobSpec:
    """The job that holds an instance's GPUs (and its cgroup or allocation) until it is stopped."""
    return JobSpec(
        key=spec.key,
        workspace=spec.workspace,
        name=spec.name,
        command="exec sleep infinity",
        work_dir=spec.work_dir,
        devices=[spec.devices],
        cpu_cores=spec.cpu_cores,
        memory_gb=spec.memory_gb,
        run_as=spec.run_as,
        portal_env=dict(spec.portal_env),
        writable_dir=spec.writable_dir,
        disk=spec.disk,
    )


def notebook_job(spec: NotebookSpec, env_dir: Path, *, ip: str = "", sock: str = "") -> JobSpec:
    """The job that runs a notebook's server, with its instance's GPUs: on the Unix socket
    ``sock`` (the local backend), else on ``ip`` and ``$MASTER_PORT`` (Slurm: another machine)."""
    return JobSpec(
        key=spec.key,
        workspace=spec.workspace,
        name=spec.name,
        command=server_command(env_dir, spec, ip=ip, port="$MASTER_PORT", sock=sock),
        work_dir=spec.work_dir,
        env={"JUPYTER_TOKEN": spec.token, "PYTHONPATH": str(IDENTITY_MODULES)},
        devices=[spec.devices],
        cpu_cores=spec.cpu_cores,
        memory_gb=spec.memory_gb,
        run_as=spec.run_as,
        portal_env=dict(spec.portal_env),
        writable_dir=spec.writable_dir,
        disk=spec.disk,
    )


def inference_job(spec: InferenceSpec, sock: str = "") -> JobSpec:
    """The job that runs an inference replica's server on the Unix socket ``sock``, with its GPUs."""
    from workers.backends import servers

    argv, env = servers.command(
        spec.server,
        model_path=spec.model_path,
        socket_path=sock,
        served_name=spec.served_name,
        cpu_cores=max(1, int(spec.cpu_cores)),
        extra_args=list(spec.extra_args),
        api_key=spec.api_key,
    )
    return JobSpec(
        key=spec.key,
        workspace=spec.workspace,
        name=spec.name,
        command="exec " + shlex.join(argv),
        work_dir=spec.work_dir,
        env=env,
        devices=[spec.devices],
        cpu_cores=spec.cpu_cores,
        memory_gb=spec.memory_gb,
        run_as=spec.run_as,
        disk=spec.disk,
    )


def kind_and_job(spec: Spec) -> tuple[str, JobSpec]:
    """What a spec runs as, as far as finding it again goes (``adopt()``): its kind (``job``,
    ``instance``, ``notebook``) and the job's key, work directory, replicas and devices. A notebook's
    command is left out: it names the notebook's environment, which finding the server needs not."""
    if isinstance(spec, InstanceSpec):
        return "instance", instance_job(spec)
    if isinstance(spec, NotebookSpec):
        server = JobSpec(spec.key, spec.workspace, spec.name, "", spec.work_dir, devices=[spec.devices])
        return "notebook", server
    if isinstance(spec, InferenceSpec):
        return "inference", JobSpec(spec.key, spec.workspace, spec.name, "", spec.work_dir, devices=[spec.devices])
    if not isinstance(spec, JobSpec):  # a Ray cluster: its backend lowers it to a job itself first
        raise BackendError(f"no job to find for a {type(spec).__name__}", permanent=True)
    return "job", spec


def search_path(environment: Path | None, path: str) -> str:
    """``path`` (a PATH value) with the environment's ``bin`` first, where there is one."""
    return f"{environment}/bin:{path}" if environment is not None else path


def server_socket(run_root: str | Path, job_dir: Path) -> Path:
    """Where the local backend's notebook server of ``job_dir`` listens: ``<root>/<digest of
    job_dir>/jupyter.sock``, outside every workspace's directory. The root is ``<run_root>/sockets``,
    or, where that makes a path too long for a Unix socket (107 bytes: a portal in a deep directory),
    the portal's own ``<temporary directory>/gpuportal-sockets-<uid>``; a permanent
    ``BackendError`` where neither fits."""
    digest = hashlib.sha256(str(job_dir).encode()).hexdigest()[:12]
    roots = [Path(run_root) / "sockets", Path(tempfile.gettempdir()) / f"gpuportal-sockets-{os.geteuid()}"]
    for root in roots:
        path = root / digest / SOCKET_NAME
        if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
            return path
    raise BackendError(
        f"the notebook server's socket {path} is longer than a Unix socket's {MAX_SOCKET_PATH} bytes: "
        "give the temporary directory (TMPDIR) a shorter path",
        permanent=True,
    )


def prepare_socket_dir(sock: Path, run_as: RunAs | None) -> None:
    """Make the socket's directory afresh, empty, mode 0700, owned by the workload's account where
    the portal runs as root: only that account (and the portal's, which the proxy runs as) can
    enter it, so no other process can listen where the proxy sends the notebook's requests. Its
    parent must be the portal's own directory (made 0700), never a link: in a shared temporary
    directory someone else may have made it first, and then nothing starts."""
    root = sock.parent.parent
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(root)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise BackendError(f"{root} is not a directory of the portal's own: remove it", permanent=True)
        os.chmod(root, 0o700)
        shutil.rmtree(sock.parent, ignore_errors=True)  # what a previous server (or its workload) left
        sock.parent.mkdir(mode=0o700)
        if run_as is not None and os.geteuid() == 0:
            os.chown(sock.parent, run_as.uid, run_as.gid, follow_symlinks=False)
        os.chmod(sock.parent, 0o700)
    except OSError as exc:
        raise BackendError(f"could not make the notebook server's socket directory: {exc}", permanent=False) from exc


def socket_url(sock: str | Path) -> str:
    """The proxy's target for a server on the Unix socket ``sock`` (configurable-http-proxy's
    ``http+unix://<percent-encoded path>``), also understood by ``http_get()``."""
    return f"{UNIX_SCHEME}://{urllib.parse.quote(str(sock), safe='')}"


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket; the Host header says ``localhost``."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def http_get(url: str, *, headers: Mapping[str, str] | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url`` (``http://host:port/...`` or ``http+unix://<encoded socket path>/...``) without
    following redirects: its status and body. ``OSError`` where no answer came."""
    parts = urllib.parse.urlsplit(url)
    connection: http.client.HTTPConnection
    if parts.scheme == UNIX_SCHEME:
        connection = _UnixConnection(urllib.parse.unquote(parts.netloc), timeout)
    elif parts.scheme == "http" and parts.hostname:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    else:
        raise OSError(f"not an http or {UNIX_SCHEME} URL: {url!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        connection.request("GET", target, headers=dict(headers or {}))
        response = connection.getresponse()
        return response.status, response.read()
    except http.client.HTTPException as exc:  # a malformed answer: as good as none
        raise OSError(f"GET {url}: {exc!r}") from exc
    finally:
        connection.close()


def wait_answering(url: str, *, alive: Callable[[], bool], log_tail: Callable[[], str], timeout_s: float) -> None:
    """Return once ``url`` (the server's unauthenticated ``api`` endpoint, over TCP or a Unix
    socket: see ``http_get()``) answers 200.

    ``BackendError`` (transient) if the server exits first, with its last log lines, or does not
    answer within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise BackendError(f"the notebook server exited: {log_tail()}", permanent=False)
        try:
            if http_get(url, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise BackendError(f"the notebook server did not answer within {timeout_s:g}s", permanent=False)
