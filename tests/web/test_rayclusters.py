"""The Ray cluster pages: the create form (the API's serializer and action, refusals beside their
fields), the list and a cluster's page in each state, isolation, and who may delete."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from django.test import Client
from django.utils import timezone

from apps.jobs.models import Artifact
from apps.rayclusters.models import RayCluster
from tests.personas import World
from tests.web.conftest import queries

SignedIn = Callable[[Any], Client]
State = RayCluster.State
NEW = "/w/team-a/ray-clusters/new/"
LIST = "/w/team-a/ray-clusters/"
NODES = [
    {"name": "head", "role": "head", "alive": True},
    {"name": "worker-0", "role": "worker", "alive": True},
    {"name": "worker-1", "role": "worker", "alive": True},
]


def made(world: World, name: str = "ray", state: str = State.RUNNING, **fields: Any) -> RayCluster:
    """A cluster row as the host leaves it in `state` (no backend: nothing runs)."""
    fields = {"workers": 2, "gpu_type": "h100", "worker_gpus": Decimal(1), "created_by": world.alice, **fields}
    if state in (State.RUNNING, State.DEGRADED):
        fields = {"nodes": NODES, "started_at": timezone.now(), **fields}
    return RayCluster.objects.create(workspace=fields.pop("workspace", world.team_a), name=name, state=state, **fields)


def form(**fields: str) -> dict[str, str]:
    return {
        "name": "tune", "workers": "2", "gpu_type": "h100", "head_gpus": "0", "head_cpu_cores": "2",
        "head_memory_gb": "8", "worker_gpus": "1", "worker_cpu_cores": "4", "worker_memory_gb": "16",
        "priority": "0", "preemptible": "on", **fields,
    }  # fmt: skip


def test_a_cluster_is_created_from_the_form_through_the_api_serializer_and_action(
    world: World, signed_in: SignedIn
) -> None:
    alice = signed_in(world.alice)
    page = alice.get(NEW).content.decode()
    assert 'name="workers" type="number" value="1"' in page  # one worker to start from
    assert '<option value="h100" selected>' in page and '<option value="gpu-1" ' in page
    response = alice.post(NEW, form(entrypoint="python tune.py", env="TRIALS=20", artifact_paths="best.json"))
    cluster = RayCluster.objects.get(name="tune")
    assert response.status_code == 302 and response["Location"] == f"/w/team-a/ray-clusters/{cluster.pk}/"
    assert (cluster.workers, cluster.worker_gpus, cluster.gpu_type, cluster.head_gpus) == (2, 1, "h100", 0)
    assert (cluster.head_cpu_cores, cluster.head_memory_gb, cluster.worker_cpu_cores) == (2, 8, 4)
    assert cluster.entrypoint == "python tune.py" and cluster.env == {"TRIALS": "20"}
    assert cluster.artifact_paths == ["best.json"] and cluster.created_by == world.alice
    assert cluster.state == State.QUEUED and cluster.preemptible


def test_a_cpu_only_cluster_and_a_profile_sized_one(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    alice.post(NEW, form(name="cpu", worker_gpus="0", gpu_type="h100"))
    cpu = RayCluster.objects.get(name="cpu")
    assert (cpu.total_gpus, cpu.gpu_type) == (0, "")  # no GPUs: the type does not matter
    # A profile replaces the sizes below it (which the form still sends).
    alice.post(NEW, form(name="sized", worker_profile="gpu-1", head_profile="cpu-small"))
    sized = RayCluster.objects.get(name="sized")
    assert (sized.worker_gpus, sized.worker_cpu_cores, sized.worker_memory_gb) == (1, 8, 64)
    assert (sized.head_gpus, sized.head_cpu_cores, sized.head_memory_gb, sized.gpu_type) == (0, 2, 8, "h100")


def test_form_errors_show_next_to_their_fields(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    cases = [
        (form(name="Not A Name"), "name", "lowercase letters, digits or '-'"),
        (form(head_cpu_cores="0"), "head_cpu_cores", "greater than or equal to 1"),
        (form(workers="300"), "workers", "less than or equal to 256"),
        (form(worker_gpus="1.5"), "worker_gpus", "more than one device must be a whole number"),
        (form(workers="3", worker_gpus="2"), "worker_gpus", "can never hold more than 4"),  # 6 GPUs: past the quota
        (form(head_gpus="1", worker_gpus="2"), "workers", "5 h100 GPUs in all"),  # each role fits, not all of them
        (form(env="1X=2"), "env", "is not a variable name"),
        (form(env="A=1\nB"), "env", "Line 2: write NAME=value."),
        (form(worker_profile="no-such"), "worker_profile", "No profile named no-such is available to you."),
    ]
    for body, field, words in cases:
        response = alice.post(NEW, body)
        page = response.content.decode().replace("&#x27;", "'")
        assert response.status_code == 400, (field, page[:300])
        error = page.split(f'id="{field}-error">', 1)
        assert len(error) == 2 and words in error[1].split("</div>", 1)[0], (field, words)
        assert f'name="{field}"' in page  # the field itself is on the page, marked
    # A refusal of a size a profile gave is shown beside the profile.
    too_big = alice.post(NEW, form(workers="5", worker_profile="gpu-1")).content.decode()
    assert 'id="worker_profile-error"><p class="field-error">This asks for 5 h100 GPUs' in too_big
    assert 'id="worker_gpus-error"' not in too_big
    assert not RayCluster.objects.exists()


def test_the_list_shows_each_cluster_where_it_stands(world: World, signed_in: SignedIn) -> None:
    made(world, "running")
    degraded = [*NODES[:2], {"name": "worker-1", "role": "worker", "alive": False}]
    made(world, "degraded", State.DEGRADED, nodes=degraded)
    made(world, "waiting", State.QUEUED, wait_reason="the quota of h100 is in use", workspace_queue_position=2)
    made(world, "broke", State.FAILED, failure_reason="its entrypoint exited with 3", exit_code=3)
    alice = signed_in(world.alice)
    live = alice.get(LIST).content.decode()
    assert 'aria-current="page">Ray clusters</a>' in live  # the workspace's navigation
    for name in ("running", "degraded", "waiting"):
        assert f'data-raycluster="{name}"' in live
    assert 'data-raycluster="broke"' not in live  # ended: in its own tab
    assert "3 of 3 nodes up" in live and "2 of 3 nodes up" in live and "down: worker-1" in live
    assert "the quota of h100 is in use" in live and "Dashboard" in live
    assert 'data-state="DEGRADED">Degraded' in live and 'data-state="QUEUED">Queued' in live
    ended = alice.get(f"{LIST}?tab=ended").content.decode()
    assert 'data-raycluster="broke"' in ended and "its entrypoint exited with 3" in ended
    fragment = alice.get(f"{LIST}?part=table&tab=live", headers={"HX-Request": "true"}).content.decode()
    assert fragment.lstrip().startswith("<table") and 'data-raycluster="running"' in fragment


def test_an_empty_list_says_what_to_do_and_a_viewer_is_not_offered_to_create(world: World, signed_in: SignedIn) -> None:
    page = signed_in(world.alice).get(LIST).content.decode()
    assert "No Ray cluster is live" in page and f'href="{NEW}"' in page
    viewer = signed_in(world.victor)
    assert f'href="{NEW}"' not in viewer.get(LIST).content.decode()
    assert viewer.get(NEW).status_code == 403
    assert viewer.post(NEW, form()).status_code == 403 and not RayCluster.objects.exists()


def test_the_list_costs_the_same_queries_for_many_rows(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    made(world, "ray-0")
    few = {tab: queries(alice, f"{LIST}?tab={tab}") for tab in ("live", "all")}
    for i in range(1, 25):
        made(world, f"ray-{i}", State.QUEUED if i % 2 else State.DEGRADED, created_by=world.bob if i % 3 else None)
    assert {tab: queries(alice, f"{LIST}?tab={tab}") for tab in ("live", "all")} == few


def test_a_running_cluster_page_has_its_nodes_dashboard_log_and_gpus(world: World, signed_in: SignedIn) -> None:
    nodes = [*NODES[:2], {"name": "worker-1", "role": "worker", "alive": False}]
    cluster = made(world, "ray", State.DEGRADED, nodes=nodes, entrypoint="python tune.py")
    page = signed_in(world.alice).get(f"{LIST}{cluster.pk}/").content.decode()
    assert 'id="raycluster-state"><span class="badge tone-' in page and "Degraded" in page
    assert f'href="{cluster.dashboard_url}"' in page and "Open dashboard" in page
    assert 'data-node="worker-1"' in page and ">Down<" in page and page.count(">Up<") == 2
    assert "2 of 3" in page and "down: worker-1" in page
    assert f'data-log-url="/api/v1/ray-clusters/{cluster.pk}/logs/"' in page and 'data-live-kind="raycluster"' in page
    assert f'hx-trigger="live-raycluster-{cluster.pk} from:body' in page
    assert "data-gpu-panel" in page and "<code>python tune.py</code>" in page
    chart = signed_in(world.alice).get(f"{LIST}{cluster.pk}/gpu.json")
    assert chart.status_code == 200 and chart.json()["telemetry"] is False
    cpu_only = made(world, "cpu", worker_gpus=Decimal(0), gpu_type="")
    assert "data-gpu-panel" not in signed_in(world.alice).get(f"{LIST}{cpu_only.pk}/").content.decode()


def test_a_waiting_and_an_ended_cluster_say_why(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    waiting = made(world, "waits", State.QUEUED, wait_reason="the quota of h100 is in use",
                   workspace_queue_position=1, cluster_queue_position=3)  # fmt: skip
    page = alice.get(f"{LIST}{waiting.pk}/").content.decode()
    assert 'id="raycluster-reason">the quota of h100 is in use' in page
    assert "1 in the workspace, 3 in the cluster" in page and "Estimated start" in page
    assert "Open dashboard" not in page and ">Waiting<" in page and "The log starts when the cluster does." in page
    failed = made(world, "broke", State.FAILED, failure_reason="its entrypoint exited with 3", exit_code=3,
                  finished_at=timezone.now(), artifact_paths=["best.json"])  # fmt: skip
    Artifact.objects.create(job=failed, path="best.json", size_bytes=12, sha256="ab" * 32)
    page = alice.get(f"{LIST}{failed.pk}/").content.decode()
    assert 'id="raycluster-failure">its entrypoint exited with 3' in page and 'id="raycluster-exit-code">3' in page
    assert f'href="/api/v1/ray-clusters/{failed.pk}/artifact/?path=best.json"' in page
    assert "Delete…" not in page and "Open dashboard" not in page  # it ended: nothing to stop


def test_another_tenant_gets_a_404_everywhere(world: World, signed_in: SignedIn) -> None:
    cluster = made(world)
    charlie = signed_in(world.charlie)
    for path in ("", "new/", f"{cluster.pk}/", f"{cluster.pk}/gpu.json", f"{cluster.pk}/delete/"):
        assert charlie.get(f"{LIST}{path}").status_code == 404, path
    assert charlie.post(f"{LIST}{cluster.pk}/delete/").status_code == 404
    # Through charlie's own workspace's address, team A's cluster is not found either.
    for path in (f"{cluster.pk}/", f"{cluster.pk}/delete/"):
        assert charlie.get(f"/w/team-b/ray-clusters/{path}").status_code == 404, path
    assert charlie.post(f"/w/team-b/ray-clusters/{cluster.pk}/delete/").status_code == 404
    cluster.refresh_from_db()
    assert cluster.state == State.RUNNING


def test_a_viewer_sees_no_delete_button_and_cannot_delete(world: World, signed_in: SignedIn) -> None:
    cluster = made(world)
    victor = signed_in(world.victor)
    page = victor.get(f"{LIST}{cluster.pk}/").content.decode()
    assert 'data-node="head"' in page and "Open dashboard" in page  # the viewer sees the cluster, its dashboard...
    assert "Delete…" not in page and "/delete/" not in page  # ...and nothing that changes it
    assert victor.get(f"{LIST}{cluster.pk}/delete/").status_code == 403
    assert victor.post(f"{LIST}{cluster.pk}/delete/").status_code == 403
    cluster.refresh_from_db()
    assert cluster.state == State.RUNNING


def test_a_member_deletes_a_cluster_after_confirming(world: World, signed_in: SignedIn) -> None:
    cluster = made(world)
    bob = signed_in(world.bob)  # a member through the team's group
    page = bob.get(f"{LIST}{cluster.pk}/").content.decode()
    assert f'href="/w/team-a/ray-clusters/{cluster.pk}/delete/"' in page
    confirm = bob.get(f"{LIST}{cluster.pk}/delete/").content.decode()
    assert "Delete Ray cluster ray?" in confirm and "every Ray job running on it" in confirm
    response = bob.post(f"{LIST}{cluster.pk}/delete/")
    assert response.status_code == 302 and response["Location"] == f"{LIST}{cluster.pk}/"
    cluster.refresh_from_db()
    assert cluster.state == State.STOPPED  # nothing ran: it ends at once
    again = bob.post(f"{LIST}{cluster.pk}/delete/")
    assert again.status_code == 400 and "has already ended (stopped)" in again.content.decode()


def test_a_live_update_takes_the_delete_button_away_once_the_cluster_ended(world: World, signed_in: SignedIn) -> None:
    cluster = made(world)
    alice = signed_in(world.alice)
    url = f"{LIST}{cluster.pk}/?part=status"
    running = alice.get(url, headers={"HX-Request": "true"}).content.decode()
    assert '<div id="raycluster-actions" class="actions" hx-swap-oob="true">' in running and "Delete…" in running
    assert 'data-node="worker-1"' in running and 'id="log-title"' not in running  # the live panels alone
    RayCluster.objects.filter(pk=cluster.pk).update(state=State.SUCCEEDED, exit_code=0, finished_at=timezone.now())
    ended = alice.get(url, headers={"HX-Request": "true"}).content.decode()
    assert 'hx-swap-oob="true">' in ended and "Delete…" not in ended and "Open dashboard" not in ended
    assert 'data-state="SUCCEEDED">Succeeded' in ended and ">Ended<" in ended


def test_the_launch_wizard_offers_a_ray_cluster(world: World, signed_in: SignedIn) -> None:
    page = signed_in(world.alice).get("/w/team-a/instances/new/").content.decode()
    assert f'<a href="{NEW}">Create a Ray cluster</a>' in page
