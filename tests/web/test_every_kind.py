"""The pages that show a workspace's or the whole portal's work list every kind of workload: the
overview, a workspace's dashboard and the console's queue show Ray clusters beside jobs,
instances and notebooks (read from the one workload table and the kind registry), never another
tenant's, at a cost in queries that does not grow with the rows."""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from django.test import Client

from apps.compute.actions import check_launch_instance
from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.rayclusters.actions import check_create_cluster
from apps.rayclusters.models import RayCluster
from tests.personas import World
from tests.web.conftest import queries
from tests.web.test_rayclusters import made

SignedIn = Callable[[Any], Client]
State = RayCluster.State


def _section(page: str, title_id: str) -> str:
    """The panel whose heading has this id, up to its end."""
    return page.split(f'id="{title_id}"')[1].split("</section>")[0]


def _hog(world: World, committed: Any, gpus: int = 4) -> Job:
    """A job of bob's, admitted at once, that holds `gpus` of team-a's 4 H100."""
    with committed():
        return check_submit_job(world.team_a, name="hog", command="true", gpu_type="h100",
                                gpus_per_replica=Decimal(gpus), acting_user=world.bob)  # fmt: skip


def _waiting_cluster(world: World, committed: Any, name: str = "tune", user: Any = None) -> RayCluster:
    """A Ray cluster of two 1-GPU workers that waits for team-a's quota (the scheduler's reason set)."""
    with committed():
        cluster = check_create_cluster(world.team_a, name=name, workers=2, gpu_type="h100",
                                       worker_gpus=Decimal(1), acting_user=user or world.alice)  # fmt: skip
    cluster.refresh_from_db()
    assert cluster.state == State.QUEUED and cluster.wait_reason.startswith("waiting for quota")
    return cluster


def test_the_overview_shows_ray_clusters_running_and_queued_beside_the_other_kinds(
    world: World, signed_in: SignedIn, committed: Any
) -> None:
    _hog(world, committed)
    waiting = _waiting_cluster(world, committed)
    running = made(world, "serve", State.RUNNING)
    theirs = made(world, "charlies-ray", State.RUNNING, workspace=world.team_b, created_by=world.charlie)
    check_create_cluster(world.team_b, name="charlies-queued", workers=1, acting_user=world.charlie)
    check_launch_instance(world.team_a, name="box", profile=world.cpu_small, acting_user=world.alice)

    page = signed_in(world.alice).get("/").content.decode()
    assert '<b data-count="rayclusters">2</b><span>Ray clusters</span>' in page
    assert '<b data-count="jobs">1</b><span>Job</span>' in page
    assert '<b data-count="queued">2</b>' in page  # the cluster and the instance
    clusters = _section(page, "raycluster-title")
    assert f'<a href="/w/team-a/ray-clusters/{running.pk}/">serve</a>' in clusters
    assert "2 × H100" in clusters and 'data-state="RUNNING">Running' in clusters
    queue = _section(page, "queued-title")
    row = re.search(rf'<tr data-kind="raycluster">\s*<td[^>]*><a href="/w/team-a/ray-clusters/{waiting.pk}/">tune</a>'
                    r"</td>\s*<td[^>]*>Ray cluster</td>.*?</tr>", queue, re.S)  # fmt: skip
    assert row is not None, queue
    assert waiting.wait_reason in row.group(0).replace("&#x27;", "'")
    assert '<tr data-kind="instance">' in queue
    # Another tenant's clusters, queued or running, are nowhere on it.
    assert "charlies" not in page and f"/ray-clusters/{theirs.pk}/" not in page
    # Charlie's overview has his and nothing of team-a's.
    charlies = signed_in(world.charlie).get("/").content.decode()
    assert "charlies-ray" in charlies and "charlies-queued" in charlies
    assert "serve" not in charlies and "tune" not in charlies


def test_the_dashboard_lists_my_ray_clusters_in_my_queue_and_my_running_work(
    world: World, signed_in: SignedIn, committed: Any
) -> None:
    _hog(world, committed)
    waiting = _waiting_cluster(world, committed)
    _waiting_cluster(world, committed, "bobs-tune", user=world.bob)
    running = made(world, "serve", State.DEGRADED)
    made(world, "team-b-ray", State.QUEUED, workspace=world.team_b, created_by=world.charlie)

    page = signed_in(world.alice).get("/w/team-a/").content.decode()
    mine = _section(page, "myqueue-title")
    link = f'<a href="/w/team-a/ray-clusters/{waiting.pk}/">tune</a>'
    assert f'{link} <span class="muted small">Ray cluster</span>' in mine
    assert waiting.wait_reason in mine.replace("&#x27;", "'")
    assert "bobs-tune" not in mine  # bob's: in the workspace, not mine
    work = _section(page, "progress-title")
    assert f'<a href="/w/team-a/ray-clusters/{running.pk}/">serve</a>' in work
    assert 'data-state="DEGRADED">Degraded' in work and "Ray cluster · 2 × H100" in work
    # The workspace's counts: alice's degraded cluster runs (bob's job is admitted, not started); two
    # clusters wait.
    assert "<b>1</b><span>running in the workspace</span>" in page
    assert "<b>2</b><span>queued in the workspace</span>" in page
    assert "<b>1</b><span>of mine running</span>" in page and "<b>1</b><span>of mine waiting</span>" in page
    assert "team-b-ray" not in page
    assert signed_in(world.alice).get("/w/team-b/").status_code == 404


def test_the_consoles_queue_shows_ray_clusters_waiting_and_admitted_with_their_kind(
    world: World, signed_in: SignedIn, committed: Any
) -> None:
    _hog(world, committed)
    waiting = _waiting_cluster(world, committed)
    with committed():  # team-b has room: admitted at once (nothing starts it here)
        admitted = check_create_cluster(world.team_b, name="starts", workers=1, gpu_type="h100",
                                        worker_gpus=Decimal(1), acting_user=world.charlie)  # fmt: skip
    admitted.refresh_from_db()
    assert admitted.state == State.ADMITTED
    running = made(world, "serve", State.RUNNING, workspace=world.team_b, created_by=world.charlie)

    page = signed_in(world.admin).get("/console/").content.decode()
    assert "<b>1</b><span>pending</span>" in page  # the queued cluster; the admitted one starts
    queue = _section(page, "queue-title")
    rows = re.findall(r'<tr data-kind="(\w+)">(.*?)</tr>', queue, re.S)
    assert [kind for kind, _ in rows] == ["job", "raycluster", "raycluster"]  # admitted first, then the queue
    hog, starting, queued = (cells for _, cells in rows)
    assert "hog" in hog and "admitted, starting" in hog
    assert f'starts <span class="muted small">#{admitted.pk}</span>' in starting
    assert "admitted, starting" in starting and '<td data-label="Estimated start">now</td>' in starting
    assert f'tune <span class="muted small">#{waiting.pk}</span>' in queued
    assert '<td data-label="Kind">Ray cluster</td>' in queued and '<td data-label="GPUs">2 × H100</td>' in queued
    assert waiting.wait_reason in queued.replace("&#x27;", "'")
    assert f'<td data-label="Position" class="num">{waiting.cluster_queue_position}</td>' in queued
    assert '<td data-label="Estimated start">' in queued
    running_panel = _section(page, "running-title")
    assert f'serve <span class="muted small">#{running.pk}</span>' in running_panel
    assert '<td data-label="Kind">Ray cluster</td>' in running_panel and "hog" not in running_panel
    assert signed_in(world.alice).get("/console/").status_code in (302, 403, 404)


def test_the_pages_cost_the_same_queries_for_many_workloads_of_every_kind(
    world: World, signed_in: SignedIn, committed: Any
) -> None:
    alice, admin = signed_in(world.alice), signed_in(world.admin)
    urls = {alice: ["/", "/w/team-a/"], admin: ["/console/"]}
    made(world, "ray-0", State.RUNNING)
    check_create_cluster(world.team_a, name="queued-0", workers=1, acting_user=world.alice)
    check_submit_job(world.team_a, name="job-0", command="true", acting_user=world.alice)
    few = {url: queries(client, url) for client, pages in urls.items() for url in pages}
    for i in range(1, 12):
        made(world, f"ray-{i}", State.RUNNING if i % 2 else State.ADMITTED)
        check_create_cluster(world.team_a, name=f"queued-{i}", workers=2, acting_user=world.alice)
        check_submit_job(world.team_a, name=f"job-{i}", command="true", acting_user=world.alice)
    assert {url: queries(client, url) for client, pages in urls.items() for url in pages} == few


def test_gpu_use_against_the_quota_counts_what_a_ray_cluster_holds(world: World, signed_in: SignedIn) -> None:
    made(world, "serve", State.RUNNING)  # its two workers hold one H100 each
    made(world, "ended", State.STOPPED)  # holds nothing any more
    alice = signed_in(world.alice)
    assert '<div class="mono">2 / 4</div>' in _section(alice.get("/").content.decode(), "usage-title")
    assert '<div class="mono">2 / 4</div>' in _section(alice.get("/w/team-a/").content.decode(), "quota-title")
    quotas = world.client(world.alice).get("/api/v1/quotas/", {"workspace": "team-a"}).json()["results"]
    assert [(q["gpu_type"], q["in_use"]) for q in quotas] == [("h100", "2.00")]
