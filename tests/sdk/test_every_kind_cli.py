"""`gpuportal queue` and `gpuportal ls --kind` list every kind of workload (a Ray cluster beside the
jobs, with its kind), through `client.workloads`, against a live embedded portal; nothing of
another tenant's shows, though it waits in the same queue.

As in test_ray_cli.py no Ray cluster starts: the GPU of workspace demo, and that of the admin's
own workspace (another tenant, for the demo user), is held by a running job, so their clusters
and jobs queue.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal

import pytest
from gpuportal import Client, Conflict, RayCluster

from tests.sdk.conftest import LivePortal, Run, until, wait_for
from tests.sdk.test_ray_sdk import WAITING

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Queued:
    cluster: int  # demo's Ray cluster
    job: int  # demo's job
    theirs: int  # the admin's Ray cluster, in the admin's own workspace
    admin: Client


@contextlib.contextmanager
def _held(client: Client, workspace: str) -> Iterator[None]:
    """The workspace's only GPU held by a running job; its queued work ended on the way out."""
    hog = client.jobs.submit(name="hog", workspace=workspace, command="sleep 900", gpus=1, max_runtime="20m")
    try:
        wait_for(client, hog.id, lambda job: job.state == "RUNNING")
        yield
    finally:
        for cluster in client.ray_clusters.list(workspace, state=["QUEUED", "ADMITTED", "RUNNING", "DEGRADED"]):
            with contextlib.suppress(Conflict):
                client.ray_clusters.delete(cluster.id)
        for job in client.jobs.list(workspace, state=["QUEUED", "ADMITTED", "RUNNING"]):
            with contextlib.suppress(Conflict):
                client.jobs.cancel(job.id)


def _placed(client: Client, cluster: RayCluster) -> None:
    until(lambda: client.ray_clusters.get(cluster.id), lambda c: c.queue_info.position is not None)


@pytest.fixture(scope="module")
def queued(live_portal: LivePortal) -> Iterator[Queued]:
    admin = Client.login(live_portal.url, "admin", live_portal.passwords["admin"])
    try:
        with live_portal.client() as demo, _held(demo, "demo"), _held(admin, "admin"):
            theirs = admin.ray_clusters.create(name="not-yours", workspace="admin", workers=1, worker_gpus=Decimal(1))
            cluster = demo.ray_clusters.create(name="every", workspace="demo", workers=2, worker_gpus=Decimal("0.5"))
            job = demo.jobs.submit(name="waiter", workspace="demo", command="true", gpus=1)
            for client, made in ((admin, theirs), (demo, cluster)):
                _placed(client, made)
            wait_for(demo, job.id, lambda j: j.queue_info.position is not None)
            yield Queued(cluster=cluster.id, job=job.id, theirs=theirs.id, admin=admin)
    finally:
        admin.revoke_token()
        admin.close()


def test_the_queue_lists_a_ray_cluster_beside_the_jobs_with_its_kind(cli: Run, queued: Queued) -> None:
    table = cli("queue", "-w", "demo")
    assert table.returncode == 0, table.stderr
    assert re.match(r"Pos\s+In workspace\s+ID\s+Name\s+Workspace\s+GPUs\s+Kind\s+Estimated start\s+Waiting because\n",
                    table.stdout), table.stdout  # fmt: skip
    shared = "0.5 × H100 on each of 2 replicas"
    cluster_row = rf"^\d+\s+\d\s+{queued.cluster}\s+every\s+demo\s+{shared}\s+raycluster\s+.*{WAITING}$"
    assert re.search(cluster_row, table.stdout, re.M), table.stdout
    assert re.search(rf"^\d+\s+\d\s+{queued.job}\s+waiter\s+demo\s+1 × H100\s+job\s+.*{WAITING}$", table.stdout, re.M)

    listed = json.loads(cli("queue", "--json").stdout)  # every workspace of mine
    assert {(w["id"], w["kind"]) for w in listed} >= {(queued.cluster, "raycluster"), (queued.job, "job")}
    cluster = next(w for w in listed if w["id"] == queued.cluster)
    assert cluster["wait_reason"] == WAITING and cluster["cluster_queue_position"] is not None
    assert [(p["role"], p["replicas"], p["gpus"]) for p in cluster["podsets"]] == [
        ("head", 1, "0.000"), ("worker", 2, "0.500")
    ]  # fmt: skip
    only = json.loads(cli("queue", "-w", "demo", "--kind", "raycluster", "--json").stdout)
    assert [w["id"] for w in only] == [queued.cluster]


def test_ls_lists_every_kind_with_a_kind_column_and_jobs_alone_by_default(cli: Run, queued: Queued) -> None:
    every = cli("ls", "--kind", "all", "-w", "demo")
    assert every.returncode == 0, every.stderr
    assert re.match(r"ID\s+Kind\s+Name\s+Workspace\s+GPUs\s+State\s+Queue / running for\n", every.stdout)
    row = rf"^{queued.cluster}\s+raycluster\s+every\s+demo\s+0.5 × H100 on each of 2 replicas\s+QUEUED\s+#\d {WAITING}$"
    assert re.search(row, every.stdout, re.M), every.stdout
    assert re.search(r"^\d+\s+job\s+hog\s+demo\s+1 × H100\s+RUNNING\s+\d+:\d\d:\d\d$", every.stdout, re.M)
    clusters = json.loads(cli("ls", "-w", "demo", "-k", "raycluster", "--state", "QUEUED", "--json").stdout)
    assert [(w["id"], w["kind"], w["state"]) for w in clusters] == [(queued.cluster, "raycluster", "QUEUED")]

    jobs = cli("ls", "-w", "demo").stdout  # as before: jobs, in the job table
    assert re.match(r"ID\s+Name\s+Workspace\s+GPUs\s+State\s+Queue / running for\n", jobs), jobs
    assert re.search(rf"^{queued.job}\s+waiter\s+demo\s+1 × H100\s+QUEUED\s+#\d {WAITING}$", jobs, re.M), jobs
    assert not re.search(rf"^{queued.cluster}\s", jobs, re.M) and "every" not in jobs

    refused = cli("ls", "--kind", "rays")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.startswith("Error: --kind: Not a choice: rays. Choose among: "), refused.stderr
    assert "raycluster" in refused.stderr and "Traceback" not in refused.stderr


def test_another_tenants_work_in_the_same_queue_never_shows(cli: Run, queued: Queued) -> None:
    # The admin's cluster waits in the same queue, and its owner sees it there.
    assert queued.theirs in [w.id for w in queued.admin.workloads.queue("admin")]
    for args in (("queue",), ("queue", "--kind", "raycluster"), ("ls", "--kind", "all", "-n", "500")):
        shown = cli(*args, "--json")
        assert shown.returncode == 0, shown.stderr
        assert queued.theirs not in [w["id"] for w in json.loads(shown.stdout)], args
        assert "not-yours" not in cli(*args).stdout, args
    refused = cli("queue", "-w", "admin", "--json")
    assert refused.returncode == 0 and json.loads(refused.stdout) == []
