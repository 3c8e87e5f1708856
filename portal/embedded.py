"""The embedded portal: web (ASGI), a Celery worker, the scheduler loop and the notebook proxy,
from one command.

Run by deploy/run.sh after it has set up the virtualenv and the Node packages. It migrates,
seeds the demo, starts the four processes, prints the URL and the logins, and on Ctrl-C (or
SIGTERM) stops them all, leaving no stray processes. The proxy (configurable-http-proxy) listens
on the public port and routes by host: everything goes to the web process, except each
notebook's own host name (``<name>-<id>.localhost`` unless PORTAL_NOTEBOOK_DOMAIN says
otherwise), which it sends to that notebook's server.
"""

from __future__ import annotations

import argparse
import contextlib
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


def _manage(*args: str) -> None:
    subprocess.run([sys.executable, str(BASE_DIR / "manage.py"), *args], check=True, cwd=BASE_DIR)


def _start(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = open(log_dir / f"{name}.log", "ab")  # noqa: SIM115 - kept open for the child's lifetime
    # Each child leads its own process group, so stopping it also stops whatever it forked.
    return subprocess.Popen(argv, cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(children: dict[str, subprocess.Popen[bytes]], grace_s: float = 10.0) -> None:
    for child in children.values():
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
    for child in children.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the group may outlive its leader
        child.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_http(url: str, children: dict[str, subprocess.Popen[bytes]], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(child.poll() is not None for child in children.values()):
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
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    problem = sandbox_problem()
    if problem:
        print(problem, flush=True)
        return 1

    print("Preparing the database and the demo...", flush=True)
    _manage("migrate", "--no-input", "-v", "0")
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
    proxy = [
        str(BASE_DIR / "node_modules" / ".bin" / "configurable-http-proxy"),
        *("--ip", args.host, "--port", str(args.port), "--api-ip", "127.0.0.1", "--api-port", str(proxy_api_port)),
        *("--default-target", f"http://127.0.0.1:{web_port}", "--host-routing", "--log-level", "warn"),
    ]
    children = {
        "web": _start(
            "web", [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(web_port), "portal.asgi:application"], log_dir
        ),
        "proxy": _start("proxy", proxy, log_dir, env={**os.environ, "CONFIGPROXY_AUTH_TOKEN": proxy_token}),
        "worker": _start(
            "worker", [python, "-m", "celery", "-A", "portal", "worker", "--pool=solo", "--loglevel=INFO"], log_dir
        ),
        "scheduler": _start("scheduler", [python, str(BASE_DIR / "manage.py"), "run_scheduler"], log_dir),
    }
    stopping = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        url = os.environ["PORTAL_PUBLIC_URL"]
        if not _wait_for_http(f"{public_url(args.host, args.port)}/healthz", children):
            failed = [name for name, child in children.items() if child.poll() is not None]
            print(f"The portal did not start ({', '.join(failed) or 'web timed out'}); see {log_dir}.", flush=True)
            return 1
        print(f"\nGPU Portal is running at {url}", flush=True)
        print(f"API docs: {url}/api/docs/   Logs: {log_dir}   Stop: Ctrl-C\n", flush=True)
        while not stopping:
            for name, child in children.items():
                if child.poll() is not None:
                    log = log_dir / f"{name}.log"
                    print(f"{name} exited with status {child.returncode}; stopping. See {log}", flush=True)
                    return 1
            time.sleep(0.5)
        print("Stopping...", flush=True)
        return 0
    finally:
        _stop(children)
        # Jobs, instances and notebooks run in their own process groups, so that a worker restart
        # does not kill them: stop them too (jobs are requeued, the others start again next time).
        _manage("stop_local_workloads")


if __name__ == "__main__":
    sys.exit(main())
