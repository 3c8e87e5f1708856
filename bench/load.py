"""Load on the production stack: PostgreSQL, Redis, the web process (gunicorn and its uvicorn
workers), a Celery worker and the scheduler loop.

    .venv/bin/python bench/load.py [--users 50] [--seconds 60] [--web-workers 2] [--json bench/out/load.json]

Makes a database of its own (``gpuportal_load`` on the PostgreSQL of DATABASE_URL, else
127.0.0.1), starts the three processes with Redis (LOAD_REDIS_URL, else 127.0.0.1:6379/14) as broker
and channel layer, signs in ``--users`` users of one workspace (4 h100 of quota: a few jobs run,
the rest queue, so the scheduler works on a growing queue), and runs locust headless
(bench/locustfile.py: submit, list, detail, log). locust runs from its own virtualenv,
``.venv-load``, made here from bench/requirements-load.txt. Prints and writes p50, p95 and p99
latency, throughput and failures per request and in all, and the share of a core each process
(web, worker, scheduler, PostgreSQL, locust) used; then stops everything and drops the database.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOAD_VENV = ROOT / ".venv-load"
SETUP = """
from decimal import Decimal
import json, sys
from django.contrib.auth.models import User
from apps.accounts.api_tokens import do_create_token
from apps.inventory.actions import do_sync_local_cluster
from apps.inventory.discovery import parse_declared
from apps.workspaces.models import GPUQuota, Membership, Role, Workspace
do_sync_local_cluster(parse_declared("8xh100"))
workspace = Workspace.objects.create(name="load", max_instances=10, max_notebooks=10)
GPUQuota.objects.create(workspace=workspace, gpu_type="h100", gpus=Decimal(4))
tokens = []
for n in range(int(sys.argv[1])):
    user = User.objects.create_user(f"load{n}")
    Membership.objects.create(workspace=workspace, user=user, role=Role.MEMBER)
    tokens.append(do_create_token(user, name="load", expires_in_days=1, acting_user=user)[1])
print(json.dumps(tokens))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _admin_url(database_url: str, name: str) -> tuple[str, str]:
    base = database_url.rsplit("/", 1)[0]
    return f"{base}/postgres", f"{base}/{name}"


def _sql(admin_url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(statement)


def _ensure_locust() -> Path:
    locust = LOAD_VENV / "bin" / "locust"
    if not locust.exists():
        subprocess.run([sys.executable, "-m", "venv", str(LOAD_VENV)], check=True)
        pip = [str(LOAD_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "-r", str(ROOT / "bench" / "requirements-load.txt")], check=True)
    return locust


def _cpu_seconds() -> dict[int, tuple[int, str, float]]:
    """Every process: pid -> (parent pid, command line, CPU seconds used so far)."""
    tick = os.sysconf("SC_CLK_TCK")
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), cmdline, (int(fields[11]) + int(fields[12])) / tick)
    return table


def _cpu_by_part(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each process tree in `roots`, and by the database's backends."""
    table = _cpu_seconds()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    out = {}
    for name, root in roots.items():
        pids, total = [root], 0.0
        while pids:
            pid = pids.pop()
            total += table.get(pid, (0, "", 0.0))[2]
            pids.extend(children.get(pid, []))
        out[name] = total
    backends = [cpu for _, cmdline, cpu in table.values() if "postgres" in cmdline and "gpuportal_load" in cmdline]
    out["postgres"] = sum(backends)
    return out


def _summary(stats_csv: Path, seconds: int) -> dict[str, dict[str, float]]:
    rows = list(csv.DictReader(stats_csv.open()))
    out = {}
    for row in rows:
        name = row["Name"] if row["Type"] else "all"
        requests = int(row["Request Count"])
        out[name] = {
            "requests": requests,
            "failures": int(row["Failure Count"]),
            "per_second": round(requests / seconds, 1),
            "p50_ms": float(row["50%"] or 0),
            "p95_ms": float(row["95%"] or 0),
            "p99_ms": float(row["99%"] or 0),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--web-workers", type=int, default=2,
                        help="uvicorn workers under gunicorn (the production web process); 0: one Daphne")  # fmt: skip
    parser.add_argument("--json", type=Path, default=Path("bench/out/load.json"))
    args = parser.parse_args()
    locust = _ensure_locust()
    base_url = os.environ.get("DATABASE_URL", "postgres://gpuportal:gpuportal@127.0.0.1:5432/x")
    admin, database = _admin_url(base_url, "gpuportal_load")
    _sql(admin, "DROP DATABASE IF EXISTS gpuportal_load WITH (FORCE)")
    _sql(admin, "CREATE DATABASE gpuportal_load")
    work = Path(tempfile.mkdtemp(prefix="gpuportal-load-"))
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": database, "REDIS_URL": os.environ.get("LOAD_REDIS_URL", "redis://127.0.0.1:6379/14"),
           "PORTAL_DATA_DIR": str(work / "data"), "SECRET_KEY": secrets.token_urlsafe(50),
           "PORTAL_PUBLIC_URL": f"http://127.0.0.1:{port}"}  # fmt: skip
    env.pop("CELERY_BROKER_URL", None)
    python = sys.executable
    manage = [python, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--no-input", "-v", "0"], cwd=ROOT, env=env, check=True)
    tokens = subprocess.run([*manage, "shell", "-c", SETUP.replace("int(sys.argv[1])", str(args.users))],
                            cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout  # fmt: skip
    token_file = work / "tokens.json"
    token_file.write_text(tokens.strip().splitlines()[-1])
    logs = work / "logs"
    logs.mkdir()
    celery = [python, "-m", "celery", "-A", "portal", "worker"]
    commands = {
        "web": (
            [
                python,
                "-m",
                "gunicorn",
                "-c",
                "python:portal.gunicorn_conf",
                "-b",
                f"127.0.0.1:{port}",
                "-w",
                str(args.web_workers),
                "portal.asgi:application",
            ]
            if args.web_workers
            else [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "portal.asgi:application"]
        ),
        "worker": [*celery, "-Q", "celery,provision", "--pool=solo", "--loglevel=WARNING"],
        "scheduler": [*manage, "run_scheduler"],
    }
    processes = {
        name: subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=(logs / f"{name}.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        for name, argv in commands.items()
    }
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the web process did not start; see {logs}") from None
                time.sleep(0.3)
        prefix = work / "locust"
        roots = {name: process.pid for name, process in processes.items()}
        before = _cpu_by_part(roots)
        locust_before = resource.getrusage(resource.RUSAGE_CHILDREN)  # locust is the only child waited for
        subprocess.run(
            [str(locust), "-f", str(ROOT / "bench" / "locustfile.py"), "--headless", "-u", str(args.users),
             "-r", str(max(1, args.users // 5)), "-t", f"{args.seconds}s", "-H", f"http://127.0.0.1:{port}",
             "--csv", str(prefix), "--only-summary", "--loglevel", "WARNING"],
            cwd=ROOT, env={**env, "LOAD_TOKENS": str(token_file)}, check=False,
        )  # fmt: skip
        after = _cpu_by_part(roots)
        locust_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # The share of one core each part used while locust ran.
        cpu = {name: round((after[name] - before[name]) / args.seconds, 2) for name in after}
        locust_s = sum(getattr(locust_after, f) - getattr(locust_before, f) for f in ("ru_utime", "ru_stime"))
        cpu["locust"] = round(locust_s / args.seconds, 2)
        stats = _summary(Path(f"{prefix}_stats.csv"), args.seconds)
        results = {"users": args.users, "seconds": args.seconds, "web_workers": args.web_workers,
                   "cpu_cores_used": cpu, "requests": stats}  # fmt: skip
    finally:
        for process in processes.values():
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:  # still busy with queued requests
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        _sql(admin, "DROP DATABASE IF EXISTS gpuportal_load WITH (FORCE)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
