"""The embedded portal: web (ASGI), two Celery workers, the scheduler loop and the notebook proxy,
from one command.

Run by deploy/run.sh after it has set up the virtualenv and the Node packages. It migrates,
seeds the demo, starts the five processes, prints the URL and the logins, and on Ctrl-C (or
SIGTERM) stops them all, leaving no stray processes. It supervises them: a process that dies is
started again after a delay that doubles while it keeps dying (1 s up to 30 s), and every child
dies with the supervisor, however the supervisor dies. A lock on the data directory keeps a
second portal from starting beside a live one. The proxy (configurable-http-proxy) listens
on the public port and routes by host: everything goes to the web process, except each
notebook's own host name (``<name>-<id>.localhost`` unless PORTAL_NOTEBOOK_DOMAIN says
otherwise), which it sends to that notebook's server.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


# How many builds and starts the provisioning worker runs at once: threads, as they mostly wait
# (on pip, a server to answer, Slurm), each on its own database connection.
PROVISION_CONCURRENCY = 4
RESTART_BACKOFF_S = (1.0, 30.0)  # the first delay before restarting a crashed child, and the longest
HEALTHY_AFTER_S = 60.0  # a child that ran this long starts over from the first delay when it crashes
_PR_SET_PDEATHSIG = 1


def _manage(*args: str) -> None:
    subprocess.run([sys.executable, str(BASE_DIR / "manage.py"), *args], check=True, cwd=BASE_DIR)


def _die_with_supervisor() -> None:
    """In a child, before it runs: SIGTERM when the supervisor dies, even of SIGKILL, so that no
    web, worker, scheduler or proxy outlives it. (Workloads are the worker's children and lead
    their own sessions: they outlive a crash and are reattached.)"""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


class Child:
    """One process of the portal, restarted with a growing delay whenever it exits on its own."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.env, self.log_path = name, argv, env, log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.delay_s = RESTART_BACKOFF_S[0]
        self.restart_at: float | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            # Each child leads its own process group, so stopping it also stops whatever it forked.
            self.process = subprocess.Popen(
                self.argv, cwd=BASE_DIR, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_supervisor,
            )  # fmt: skip
        self.started_at, self.restart_at = time.monotonic(), None

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def heal(self) -> None:
        """Restart the child once its delay has passed; the delay doubles while it keeps crashing."""
        now = time.monotonic()
        if self.restart_at is None:
            if now - self.started_at >= HEALTHY_AFTER_S:
                self.delay_s = RESTART_BACKOFF_S[0]
            assert self.process is not None
            print(
                f"{self.name} exited with status {self.process.returncode}; restarting it in {self.delay_s:g} s. "
                f"See {self.log_path}",
                flush=True,
            )
            self.restart_at = now + self.delay_s
            self.delay_s = min(self.delay_s * 2, RESTART_BACKOFF_S[1])
        elif now >= self.restart_at:
            self.start()


def _stop(children: dict[str, Child], grace_s: float = 10.0) -> None:
    processes = [child.process for child in children.values() if child.process is not None]
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the group may outlive its leader
        process.wait()


def lock_data_dir(data_dir: Path) -> int | None:
    """Hold the data directory's lock for as long as this process lives (the kernel drops it when
    the process dies, however it dies); None, having said why, if another portal holds it."""
    fd = os.open(data_dir / "portal.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        print(
            f"Another GPU Portal (pid {holder}) is running on {data_dir}: stop it first (Ctrl-C where it "
            "runs), or give this one another PORTAL_DATA_DIR.",
            flush=True,
        )
        return None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_http(url: str, children: dict[str, Child], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(child.exited() for child in children.values()):
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            time.sleep(0.3)
    return False


def secure_data_dir(data_dir: Path) -> None:
    """The data directory is the portal's alone (0700), and so is everything in it (files 0600,
    directories 0700), an older install's world-readable database and logs included. The
    workspaces' directories and the notebook environments keep the modes the backends give them."""
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    for entry in data_dir.iterdir():
        if entry.name in ("work", "envs") or entry.is_symlink():
            continue
        for path in [entry, *(entry.rglob("*") if entry.is_dir() else [])]:
            if not path.is_symlink():
                path.chmod(0o700 if path.is_dir() else 0o600)


def sandbox_problem() -> str:
    """Why workloads could not be sandboxed here ('' if they can): the portal then refuses to start."""
    from workers.backends.base import BackendError
    from workers.backends.sandbox import check_available

    if os.environ.get("PORTAL_SANDBOX", "bwrap").strip().lower() == "off":
        print(
            "WARNING: PORTAL_SANDBOX=off: workloads are not sandboxed and run with the portal's own rights. "
            "Use this on a single-user workstation only.",
            flush=True,
        )
        return ""
    try:
        check_available()
    except BackendError as exc:
        return f"GPU Portal will not start user code unsandboxed: {exc.message}"
    return ""


def public_url(host: str, port: int) -> str:
    """The portal's address for a browser on this machine: a wildcard bind is reached on loopback."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default=os.environ.get("PORTAL_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORTAL_PORT", "8000")))
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    data_dir = Path(os.environ.get("PORTAL_DATA_DIR", BASE_DIR / "var")).resolve()
    os.umask(0o077)  # what the portal's processes write (database, logs, broker) is theirs alone
    secure_data_dir(data_dir)
    if lock_data_dir(data_dir) is None:
        return 1
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    problem = sandbox_problem()
    if problem:
        print(problem, flush=True)
        return 1

    print("Preparing the database and the demo...", flush=True)
    _manage("migrate", "--no-input", "-v", "0")
    # As root, this installation's block of workspace uids: refused where another portal holds it.
    if os.geteuid() == 0 and subprocess.run([sys.executable, str(BASE_DIR / "manage.py"), "uid_blocks"]).returncode:
        return 1
    from django.conf import settings

    if "channels" in settings.DATABASES:  # live updates' SQLite file, when there is no Redis
        _manage("migrate", "channels_lite", "--no-input", "-v", "0", "--database", "channels")
    _manage("collectstatic", "--no-input", "-v", "0")
    _manage("seed_demo")

    python = sys.executable
    web_port, proxy_api_port = _free_port(), _free_port()
    proxy_token = secrets.token_hex(24)
    os.environ.update(
        PORTAL_PROXY_API_URL=f"http://127.0.0.1:{proxy_api_port}",
        PORTAL_PROXY_AUTH_TOKEN=proxy_token,
        PORTAL_INTERNAL_URL=f"http://127.0.0.1:{web_port}",
    )
    # Where browsers reach the portal; notebook URLs take its scheme and port.
    os.environ.setdefault("PORTAL_PUBLIC_URL", public_url(args.host, args.port))
    # The proxy runs as the portal's own account, as the workers do: it can enter the directories
    # of the notebook servers' Unix sockets (workers/backends/processes.py), which no workload of
    # another workspace can.
    proxy = [
        str(BASE_DIR / "node_modules" / ".bin" / "configurable-http-proxy"),
        *("--ip", args.host, "--port", str(args.port), "--api-ip", "127.0.0.1", "--api-port", str(proxy_api_port)),
        *("--default-target", f"http://127.0.0.1:{web_port}", "--host-routing", "--log-level", "warn"),
    ]
    celery_worker = [python, "-m", "celery", "-A", "portal", "worker", "--loglevel=INFO"]
    children = {
        "web": Child(
            "web", [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(web_port), "portal.asgi:application"], log_dir
        ),
        "proxy": Child("proxy", proxy, log_dir, env={**os.environ, "CONFIGPROXY_AUTH_TOKEN": proxy_token}),
        # Quick tasks and provisioning on workers of their own (workers/tasks.py): an environment
        # build, a notebook or Slurm start, a stop's grace period never holds up a job or a cycle.
        "worker": Child("worker", [*celery_worker, "--pool=solo", "-Q", "celery", "-n", "quick@%h"], log_dir),
        "provision-worker": Child(
            "provision-worker",
            [*celery_worker, "--pool=threads", f"--concurrency={PROVISION_CONCURRENCY}"]
            + ["-Q", "provision", "-n", "provision@%h"],
            log_dir,
        ),
        "scheduler": Child("scheduler", [python, str(BASE_DIR / "manage.py"), "run_scheduler"], log_dir),
    }
    for child in children.values():
        child.start()
    stopping = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        url = os.environ["PORTAL_PUBLIC_URL"]
        if not _wait_for_http(f"{public_url(args.host, args.port)}/healthz", children):
            failed = [name for name, child in children.items() if child.exited()]
            print(f"The portal did not start ({', '.join(failed) or 'web timed out'}); see {log_dir}.", flush=True)
            return 1
        print(f"\nGPU Portal is running at {url}", flush=True)
        print(f"API docs: {url}/api/docs/   Logs: {log_dir}   Stop: Ctrl-C", flush=True)
        if not os.environ.get("EMAIL_HOST"):  # no mail server: invitations are written as files
            print(f"Mail (invitations): written to {data_dir / 'mail'}; set EMAIL_HOST to send it", flush=True)
        if not os.environ.get("PORTAL_METRICS_TOKEN"):
            where = data_dir / "metrics_token"
            print(f"Metrics: {url}/metrics, with 'Authorization: Bearer <the token in {where}>'", flush=True)
            print("  (a Prometheus configuration for it: deploy/prometheus/prometheus-embedded.yml)", flush=True)
        if settings.PORTAL_PREBUILD_ENVIRONMENTS:  # the provisioning worker asks for them as it starts
            envs = settings.PORTAL_NOTEBOOK_ENV_DIR
            print(f"Environments: the SDK's and each notebook profile's, built in the background in {envs}", flush=True)
            print("  (once; a job or notebook started meanwhile waits for its own, and says so)", flush=True)
        print(flush=True)
        # A child that dies is started again (running workloads are left alone and reattached);
        # the proxy's routes come back with the scheduler loop's next reconcile.
        while not stopping:
            for child in children.values():
                if child.exited():
                    child.heal()
            time.sleep(0.2)
        print("Stopping...", flush=True)
        return 0
    finally:
        _stop(children)
        # Jobs, instances and notebooks run in their own process groups, so that a worker restart
        # does not kill them: stop them too (jobs are requeued, the others start again next time).
        _manage("stop_local_workloads")


if __name__ == "__main__":
    sys.exit(main())
