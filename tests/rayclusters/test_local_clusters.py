"""Ray clusters through the portal, for real, on the local backend: requested, admitted as a whole
by the scheduler, started by the workload host (real ``ray start`` nodes in the sandbox), watched,
preempted by their owner's reclaim and run again, and torn down with nothing left behind."""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Artifact
from apps.rayclusters.actions import check_create_cluster, do_delete_cluster
from apps.rayclusters.hosting import RayClusterKind
from apps.rayclusters.models import RayCluster
from apps.scheduling.adapter import run_cycle
from apps.workloads.host import converge
from apps.workspaces.models import Cohort, Workspace
from tests.leftovers import stop_everything_of
from tests.personas import World

pytestmark = pytest.mark.slow  # real processes: run first (tests/conftest.py)

State = RayCluster.State

# Every node pinned by its custom resource: each reports what CUDA_VISIBLE_DEVICES Ray gave it.
DRIVER = """
import json, os, ray
ray.init()
@ray.remote(num_cpus=0)
def where():
    return os.environ.get("CUDA_VISIBLE_DEVICES", ""), ray.get_runtime_context().get_node_id()
found = {f"worker-{i}": ray.get(where.options(resources={f"worker-{i}": 1}).remote()) for i in range(2)}
out = os.environ["PORTAL_ARTIFACTS_DIR"]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "nodes.json"), "w") as f:
    json.dump(found, f)
print("pinned to", sorted(found))
"""


def wait_for(check: Callable[[], Any], timeout_s: float = 180.0, step_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(step_s)
    return result


def processes_of(cluster: RayCluster) -> list[int]:
    """Every process on the machine that belongs to the cluster (its key in its environment)."""
    key = f"PORTAL_JOB_KEY=raycluster-{cluster.pk}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if key in environ.split(b"\0"):
            found.append(int(entry))
    return found


def converged(cluster: RayCluster, *states: str, timeout_s: float = 180.0) -> RayCluster:
    """Converge the cluster until it is in one of `states`."""

    def done() -> RayCluster | None:
        converge("raycluster", cluster.pk)
        row = RayCluster.objects.get(pk=cluster.pk)
        return row if row.state in states else None

    return wait_for(done, timeout_s)


@pytest.fixture
def local_work(settings: Any, tmp_path: Path) -> Iterator[Path]:
    """A short work directory (a Unix socket's path must fit 107 bytes) the workspaces' accounts
    can reach; everything a test started is stopped at its end."""
    work = Path(f"/tmp/gpr-{os.getpid()}-{tmp_path.name[-12:]}")
    work.mkdir(mode=0o711)
    settings.PORTAL_WORK_DIR = work
    settings.PORTAL_RAY_START_TIMEOUT_S = 240
    try:
        yield work
    finally:
        stop_everything_of(str(work))


def test_a_fire_and_forget_ray_job_uses_every_worker_leaves_its_artifacts_and_nothing_else(
    world: World, local_work: Path
) -> None:
    cluster = check_create_cluster(
        world.team_a,
        name="fire",
        acting_user=world.alice,
        workers=2,
        gpu_type="h100",
        worker_gpus=Decimal(1),
        head_memory_gb=2,
        worker_memory_gb=2,
        entrypoint=f"python -c {shlex.quote(DRIVER)}",
        artifact_paths=["artifacts"],
    )
    run_cycle()
    assert RayCluster.objects.get(pk=cluster.pk).state == State.ADMITTED
    running = converged(cluster, State.RUNNING, State.SUCCEEDED, State.FAILED)
    ended = converged(running, State.SUCCEEDED, State.FAILED)
    assert ended.state == State.SUCCEEDED, (ended.failure_reason, ended.exit_code)
    assert ended.exit_code == 0 and not ended.allocations.exists()
    recorded = Artifact.objects.get(job_id=cluster.pk, path__endswith="nodes.json")
    opened = Path(ended.backend_state["job_dir"]) / recorded.path
    nodes = json.loads(opened.read_text())
    # Each worker ran its task, on a node of its own, seeing exactly the one GPU it was given.
    assert sorted(nodes) == ["worker-0", "worker-1"]
    assert len({node for _, node in nodes.values()}) == 2
    assert all(len(devices.split(",")) == 1 and devices for devices, _ in nodes.values())
    assert wait_for(lambda: not processes_of(ended), 30)


def test_an_interactive_cluster_runs_until_deleted_and_reports_a_missing_worker(world: World, local_work: Path) -> None:
    cluster = check_create_cluster(world.team_a, name="lab", acting_user=world.alice, workers=1, worker_memory_gb=2)
    run_cycle()
    running = converged(cluster, State.RUNNING)
    assert running.proxy_target.startswith("http+unix://")
    assert [node["name"] for node in running.nodes] == ["head", "worker-0"]
    assert processes_of(running)
    # Its backend says a worker is gone: it is degraded, never "running" with a missing worker;
    # back when the worker is.
    kind = RayClusterKind()
    kind.record_observed(running, [{"name": "head", "role": "head", "alive": True},
                                   {"name": "worker-0", "role": "worker", "alive": False}])  # fmt: skip
    assert RayCluster.objects.get(pk=cluster.pk).state == State.DEGRADED
    kind.record_observed(running, [{"name": "head", "role": "head", "alive": True},
                                   {"name": "worker-0", "role": "worker", "alive": True}])  # fmt: skip
    assert RayCluster.objects.get(pk=cluster.pk).state == State.RUNNING

    do_delete_cluster(running, acting_user=world.alice)
    stopped = converged(cluster, State.STOPPED)
    assert stopped.proxy_target == "" and not stopped.allocations.exists()
    assert wait_for(lambda: not processes_of(stopped), 30)


def test_a_borrowing_cluster_is_preempted_by_its_owners_reclaim_and_runs_again(
    world: World, local_work: Path, settings: Any
) -> None:
    settings.PORTAL_PREEMPTION_MIN_RUNTIME_S = 0
    lab = Cohort.objects.create(name="lab")
    Workspace.objects.filter(pk__in=[world.team_a.pk, world.team_b.pk]).update(cohort=lab, can_borrow=True)
    # Team B's cluster holds 6 GPUs: its own 4 and 2 of team A's idle quota.
    cluster = check_create_cluster(world.team_b, name="borrower", acting_user=world.charlie, workers=1,
                                   gpu_type="h100", worker_gpus=Decimal(6), worker_memory_gb=2)  # fmt: skip
    run_cycle()
    first = converged(cluster, State.RUNNING)
    assert first.attempts == 1

    owner = check_submit_job(world.team_a, name="mine", command="sleep 600", gpu_type="h100",
                             gpus_per_replica=Decimal(4), acting_user=world.alice)  # fmt: skip
    result = run_cycle()
    assert result.preempted == [f"raycluster:{cluster.pk}"]
    assert RayCluster.objects.get(pk=cluster.pk).state == State.PREEMPTED
    requeued = converged(cluster, State.QUEUED)
    assert requeued.wait_reason.startswith("requeued")
    assert wait_for(lambda: not processes_of(requeued), 30)

    do_cancel_job(owner, acting_user=world.alice)  # its GPUs back: the cluster runs again
    run_cycle()
    again = converged(cluster, State.RUNNING)
    assert again.attempts == 2
    do_delete_cluster(again, acting_user=world.charlie)
    assert not processes_of(converged(cluster, State.STOPPED))


def test_the_work_directory_is_short_enough_for_rays_sockets() -> None:
    # The sandbox's Unix socket lives under the work directory: the fixture's stays well within.
    assert len(f"/tmp/gpr-{os.getpid()}-{'x' * 12}/team-a/raycluster-123456/.ray/dashboard.sock") < 107
    assert django_settings.PORTAL_RAY_START_TIMEOUT_S >= 10
