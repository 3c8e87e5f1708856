"""One reconcile pass over 5,000 running workloads, per backend: what it costs the portal's process.

    DATABASE_URL=postgres://... .venv/bin/python bench/reconcile.py [--workloads 5000] [--passes 5]
        [--backends local,slurm,kubernetes] [--local-jobs 100] [--slurm-running 16] [--unbatched-slurm]
        [--kubernetes-workloads N] [--kubernetes-pods] [--unbatched-kubernetes]

Makes a throwaway database (test_<name>) on the DATABASE_URL server with one workspace and
`--workloads` jobs in RUNNING, each with the backend state of a real workload, then times
`apps.workloads.host.reconcile(sweep=False)` (the orphan sweep runs on its own, every 30 s) over
`--passes` passes after one warm-up pass, on each backend in turn:

- **local**: `--local-jobs` real jobs started by the local backend (sandbox and cgroups off: a bash
  wrapper, a log writer and `sleep` each, their logs holding `PROGRESS 0.5`); the rows share their
  states in turn, so that each row's poll reads real processes in /proc and a real log. (5,000 real
  local jobs are 15,000 processes, 5,000 of them Python log writers: more than this machine holds.)
- **slurm**: `--workloads` real batch jobs on the Slurm of deploy/slurm.sh, `--slurm-running` of
  them running (one GPU each), the others submitted held (`sbatch --hold`: squeue lists them
  PENDING, a live state, which the portal reads as running, as it reads RUNNING); each has its job
  directory and a log holding `PROGRESS 0.5`. All are cancelled at the end.
  `--unbatched-slurm` adds one pass with `host.polling` turned off (a squeue per job), to compare.
- **kubernetes**: the Kubernetes API emulator of tests/backends/kmock_cluster.py, in a process of
  its own (its CPU is not the portal's), holding `--kubernetes-workloads` (default: `--workloads`)
  Jobs submitted by the backend (`submit()`: a suspended Job and its Service in the workspace's
  namespace; the workspace's namespace objects are created by the first submit only, as the others'
  would be 409s converged again). With `--kubernetes-pods` each Job also has its pod (as once it is
  released), so each pass reads each job's log for its progress: a request per job, which no LIST
  saves (the emulator answers a log with the pod). `--unbatched-kubernetes` adds one pass with
  `host.polling` turned off (a GET of each Job, a LIST of its pods), to compare.

Each pass reports the portal process's CPU seconds (`time.process_time()`, every thread of it), the
CPU its children used (squeue and sacct: `os.times()`), wall seconds, the number of Slurm commands
run and of SQL queries. Every pass must converge every workload and change none (their progress
is already recorded): a steady state, the loop's usual pass.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ["PORTAL_SCHEDULER_TRIGGER"] = "off"
os.environ["PORTAL_WORKLOAD_TRIGGER"] = "off"
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

BENCH_OWNER = "gpuportal-bench-reconcile"  # the Slurm jobs' comment: nothing else sweeps them
# kmock keeps every request it served and scans them all for each new one (its reactions match against that log):
# tens of thousands of requests would cost it minutes each. Nothing here reads the log, so the bench's emulator keeps
# the last few (those still being served among them).
EMULATOR = """
import sys, threading
sys.path.insert(0, {root!r})
from kmock._internal import apps
from tests.backends.kmock_cluster import running_emulator

serve = apps.RawHandler.__call__

async def serve_and_forget(self, raw_request):
    try:
        return await serve(self, raw_request)
    finally:
        del self._requests[:-64]

apps.RawHandler.__call__ = serve_and_forget
with running_emulator() as emulator:
    print(emulator.url, flush=True)
    sys.stdin.read()
"""


# -- the rows --------------------------------------------------------------------------------------


def make_jobs(count: int) -> tuple[Any, list[int]]:
    """A workspace and `count` running jobs (no cluster yet), made in one transaction."""
    from apps.jobs.models import Job
    from apps.workspaces.models import Workspace

    workspace = Workspace.objects.create(name="bench", cpu_cores=100_000, memory_gb=1_000_000)
    with transaction.atomic():
        ids = [
            Job.objects.create(
                workspace=workspace, name=f"bench-{n}", command="sleep 3600", state=Job.State.RUNNING, progress=0.5
            ).pk
            for n in range(count)
        ]
    return workspace, ids


def place(ids: list[int], cluster: Any, state_of: Callable[[int, int], dict[str, Any]]) -> None:
    """Put the jobs `ids` on `cluster` with the backend state `state_of(n, pk)`; no other job is due
    (the others are marked stopped by their backend)."""
    from apps.jobs.models import Job

    Job.objects.exclude(pk__in=ids).update(backend_stopped=True)
    jobs = list(Job.objects.filter(pk__in=ids).order_by("pk"))
    for n, job in enumerate(jobs):
        job.cluster = cluster
        job.backend_state = state_of(n, job.pk)
        job.backend_stopped = False
    Job.objects.bulk_update(jobs, ["cluster", "backend_state", "backend_stopped"], batch_size=500)


# -- measuring -------------------------------------------------------------------------------------


@contextlib.contextmanager
def counted_commands() -> Iterator[Counter[str]]:
    """Counts the Slurm commands the backend runs (its one `run_command`), by name."""
    from workers.backends import slurm

    counts: Counter[str] = Counter()
    real = slurm.run_command

    def counting(argv: list[str], *args: Any, **kwargs: Any) -> str:
        counts[os.path.basename(argv[0])] += 1
        return real(argv, *args, **kwargs)

    slurm.run_command = counting  # type: ignore[assignment]
    try:
        yield counts
    finally:
        slurm.run_command = real  # type: ignore[assignment]


def passes(count: int, workloads: int) -> list[dict[str, Any]]:
    """One warm-up pass, then `count` measured ones, each converging all `workloads` and changing none."""
    from apps.jobs.models import Job
    from apps.scheduling.backoff import RECONCILE
    from apps.workloads.host import reconcile

    queries = [0]

    def count_query(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        queries[0] += 1
        return execute(sql, params, many, context)

    results = []
    for n in range(count + 1):
        RECONCILE.reset()
        queries[0] = 0
        with counted_commands() as commands, connection.execute_wrapper(count_query):
            before, wall, cpu = os.times(), time.perf_counter(), time.process_time()
            counts = reconcile(sweep=False)
            cpu, wall, after = time.process_time() - cpu, time.perf_counter() - wall, os.times()
        assert counts["converged"] == workloads and counts["failed"] == 0, counts
        assert Job.objects.filter(state=Job.State.RUNNING, backend_stopped=False).count() == workloads
        if n == 0:
            continue  # the warm-up: settles each job directory once (`load_state`), warms caches
        results.append(
            {
                "portal_cpu_s": round(cpu, 3),
                "children_cpu_s": round(max(0.0, after.children_user + after.children_system
                                            - before.children_user - before.children_system), 3),
                "wall_s": round(wall, 3),
                "queries": queries[0],
                "commands": dict(commands),
            }
        )  # fmt: skip
    return results


def summary(runs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    cpu = [r["portal_cpu_s"] for r in runs]
    return {
        **extra,
        "passes": len(runs),
        "portal_cpu_s_median": round(statistics.median(cpu), 3),
        "portal_cpu_s_max": round(max(cpu), 3),
        "children_cpu_s_median": round(statistics.median(r["children_cpu_s"] for r in runs), 3),
        "wall_s_median": round(statistics.median(r["wall_s"] for r in runs), 3),
        "queries_per_pass": runs[-1]["queries"],
        "commands_per_pass": runs[-1]["commands"],
        "runs": runs,
    }


# -- the backends ----------------------------------------------------------------------------------


def bench_local(ids: list[int], count: int, real_jobs: int, work: Path) -> dict[str, Any]:
    from apps.inventory.models import Cluster
    from workers.backends.base import JobSpec
    from workers.backends.local import LocalBackend

    cluster, _ = Cluster.objects.get_or_create(name="local", defaults={"kind": Cluster.Kind.LOCAL})
    settings.PORTAL_SANDBOX, settings.PORTAL_RESOURCE_LIMITS = "off", "off"
    backends = []
    try:
        for n in range(real_jobs):
            backend = LocalBackend(
                owner=str(settings.PORTAL_WORK_DIR), sandbox="off", resource_limits="off", run_dir=str(work / "run")
            )
            command = "echo PROGRESS 0.5; exec sleep 3600"
            backend.start(JobSpec(key=f"bench-local-{n}", workspace="bench", name="bench", command=command,
                                  work_dir=str(work / "bench")))  # fmt: skip
            backends.append(backend)
        time.sleep(1.0)  # every log holds its line
        states = [backend.get_state() for backend in backends]
        place(ids, cluster, lambda n, pk: states[n % len(states)])
        return summary(passes(count, len(ids)), backend="local", real_jobs=real_jobs)
    finally:
        for backend in backends:
            backend.stop(1.0)


def bench_slurm(ids: list[int], count: int, running: int, work: Path, unbatched: bool) -> dict[str, Any]:
    from apps.inventory.models import Cluster
    from workers.backends.base import JobSpec
    from workers.backends.slurm import _job_state

    cluster = Cluster.objects.create(name="slurm", kind=Cluster.Kind.SLURM, connection={"partition": "gpu"})
    states: dict[int, dict[str, Any]] = {}
    try:
        for n, pk in enumerate(ids):
            spec = JobSpec(key=f"job-{pk}", workspace="bench", name="bench", command="sleep 3600",
                           work_dir=str(work / "bench"))  # fmt: skip
            job_dir = work / "bench" / spec.key
            (job_dir / ".portal").mkdir(parents=True)
            (job_dir / ".portal" / "replica-0.log").write_text("PROGRESS 0.5\n")
            argv = ["sbatch", "--parsable", "-J", spec.key, "-p", "gpu", "-N", "1", f"--comment={BENCH_OWNER}",
                    "-o", "/dev/null", f"--chdir={job_dir}", "--wrap", "sleep 3600"]  # fmt: skip
            argv[1:1] = ["--gres=gpu:1"] if n < running else ["--hold"]
            job_id = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
            states[pk] = _job_state(spec, job_id, "job", None, "", time.time())
        place(ids, cluster, lambda n, pk: states[pk])
        deadline = time.monotonic() + 60
        while (seen := _listed())["RUNNING"] < running and time.monotonic() < deadline:
            time.sleep(0.5)  # until Slurm runs those it can
        result = summary(passes(count, len(ids)), backend="slurm", squeue_states=dict(seen))
        if unbatched:
            result["unbatched"] = unbatched_pass(len(ids))
        return result
    finally:
        if states:
            subprocess.run(["scancel", *(s["job_id"] for s in states.values())], capture_output=True, check=False)


def unbatched_pass(workloads: int) -> dict[str, Any]:
    """A pass (after a warm-up) with `host.polling` turned off: each workload asked alone."""
    from apps.workloads import host

    real = host.polling
    host.polling = lambda watched: contextlib.nullcontext()  # type: ignore[assignment,misc]
    try:
        return summary(passes(1, workloads))
    finally:
        host.polling = real


def _listed() -> Counter[str]:
    """The bench's Slurm jobs by the state squeue lists them in."""
    listed = subprocess.run(["squeue", "-h", "-o", "%k %T"], capture_output=True, text=True, check=True).stdout
    return Counter(line.split()[1] for line in listed.splitlines() if line.split()[0] == BENCH_OWNER)


def bench_kubernetes(ids: list[int], count: int, unbatched: bool, pods: bool) -> dict[str, Any]:
    import requests

    from apps.inventory.models import Cluster
    from workers.backends.base import JobSpec
    from workers.backends.kubernetes import KubernetesBackend

    class InItsNamespace(KubernetesBackend):
        """Its ``submit()`` leaves the workspace's jobs namespace (Namespace, NetworkPolicy) alone: the first
        submit made it, and each other would only converge it again (six requests)."""

        def _create(self, manifest: dict[str, Any]) -> dict[str, Any]:
            return dict(manifest) if manifest["kind"] in ("Namespace", "NetworkPolicy") else super()._create(manifest)

    emulator = subprocess.Popen(
        [sys.executable, "-c", EMULATOR.format(root=str(ROOT))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert emulator.stdout is not None
        url = emulator.stdout.readline().strip()
        connection_settings = {"host": url, "request_timeout_s": 30}
        cluster = Cluster.objects.create(name="k8s", kind=Cluster.Kind.KUBERNETES, connection=connection_settings)
        states: dict[int, dict[str, Any]] = {}
        for pk in ids:
            backend = (InItsNamespace if states else KubernetesBackend).from_connection(connection_settings)
            backend.submit(JobSpec(key=f"job-{pk}", workspace="bench", name="bench", command="sleep 3600",
                                   work_dir="/unused", image="python:3.12-slim"))  # fmt: skip
            states[pk] = backend.get_state()
            if pods:
                pod = job_pod(states[pk])
                requests.post(f"{url}/api/v1/namespaces/{pod['metadata']['namespace']}/pods", json=pod, timeout=30)
        place(ids, cluster, lambda n, pk: states[pk])
        result = summary(passes(count, len(ids)), backend="kubernetes", pods=pods)
        if unbatched:
            result["unbatched"] = unbatched_pass(len(ids))
        return result
    finally:
        if emulator.stdin is not None:
            emulator.stdin.close()
        emulator.wait(timeout=30)


def job_pod(state: dict[str, Any]) -> dict[str, Any]:
    """The pod of completion index 0 the Job controller makes of a submitted job's Job once it is released,
    labelled as it labels it (the Job template's labels, and its own)."""
    from workers.backends import kubernetes_objects as ko
    from workers.backends.kubernetes import _workload_name

    owner = ko.jobs_owner(state["workspace"], ko.KubeSettings())
    labels = ko.portal_labels(owner, "job", _workload_name(state["key"])) | {
        "batch.kubernetes.io/job-name": state["job"],
        "batch.kubernetes.io/job-completion-index": "0",
    }
    return {"metadata": {"name": f"{state['job']}-0-bench", "namespace": state["namespace"], "labels": labels}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=5000)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--backends", default="local,slurm,kubernetes")
    parser.add_argument("--local-jobs", type=int, default=100)
    parser.add_argument("--kubernetes-workloads", type=int, default=None)
    parser.add_argument("--slurm-running", type=int, default=16)
    parser.add_argument("--unbatched-slurm", action="store_true")
    parser.add_argument("--kubernetes-pods", action="store_true")
    parser.add_argument("--unbatched-kubernetes", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        print("Set DATABASE_URL to a PostgreSQL server (a throwaway database is made there).", file=sys.stderr)
        return 2
    setup_test_environment()
    name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    work = Path(tempfile.mkdtemp(prefix="gp-bench-reconcile-"))
    work.chmod(0o755)
    settings.PORTAL_WORK_DIR = work / "work"
    results: dict[str, Any] = {"workloads": args.workloads, "cpus": os.cpu_count()}
    try:
        _, ids = make_jobs(args.workloads)
        for backend in args.backends.split(","):
            if backend == "local":
                results["local"] = bench_local(ids, args.passes, args.local_jobs, settings.PORTAL_WORK_DIR)
            elif backend == "slurm":
                slurm_work = work / "slurm"
                results["slurm"] = bench_slurm(ids, args.passes, args.slurm_running, slurm_work, args.unbatched_slurm)
            elif backend == "kubernetes":
                kubernetes_ids = ids[: args.kubernetes_workloads or args.workloads]
                results["kubernetes"] = bench_kubernetes(
                    kubernetes_ids, args.passes, args.unbatched_kubernetes, args.kubernetes_pods
                )
            print(json.dumps({k: v for k, v in results[backend].items() if k != "runs"}), flush=True)
    finally:
        connection.creation.destroy_test_db(name, verbosity=0)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
