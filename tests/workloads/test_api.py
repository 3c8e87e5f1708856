"""`/api/v1/workloads/`: every kind's workloads in one read-only list, each with its kind, state,
pod sets and queue standing; what each caller sees is what each kind's own list shows them, and
never another tenant's."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from apps.compute.actions import check_launch_instance, check_launch_notebook
from apps.compute.collaborators import do_set_collaborator
from apps.jobs.actions import check_submit_job
from apps.rayclusters.actions import check_create_cluster
from apps.rayclusters.models import RayCluster
from apps.scheduling.adapter import run_cycle
from apps.workspaces.actions import do_update_workspace
from apps.workspaces.models import Workspace
from tests.api.endpoints import running_workload, token_client
from tests.personas import World

URL = "/api/v1/workloads/"
KIND_LISTS = ("/api/v1/jobs/", "/api/v1/instances/", "/api/v1/notebooks/", "/api/v1/ray-clusters/")


def _ids(client: APIClient, url: str = URL, **params: Any) -> set[int]:
    response = client.get(url, {"page_size": 500, **params})
    assert response.status_code == 200, response.json()
    return {row["id"] for row in response.json()["results"]}


def _every_kind(world: World, workspace: Workspace, user: Any, prefix: str = "") -> dict[str, int]:
    """One workload of each kind in `workspace`, by kind."""
    host = check_launch_instance(workspace, name=f"{prefix}box", profile=world.cpu_small, acting_user=user)
    lab = check_launch_notebook(workspace, instance=host, name=f"{prefix}lab", profile=world.minimal, acting_user=user)
    job = check_submit_job(workspace, name=f"{prefix}train", command="true", acting_user=user)
    cluster = check_create_cluster(workspace, name=f"{prefix}ray", workers=2, gpu_type="h100",
                                   worker_gpus=Decimal(1), acting_user=user)  # fmt: skip
    return {"instance": host.pk, "notebook": lab.pk, "job": job.pk, "raycluster": cluster.pk}


def test_it_lists_every_kind_with_its_kind_state_and_pod_sets(world: World) -> None:
    made = _every_kind(world, world.team_a, world.alice)
    listed = world.client(world.alice).get(URL).json()["results"]
    by_id = {row["id"]: row for row in listed}
    assert {by_id[pk]["kind"] for pk in made.values()} == set(made)
    assert all(by_id[pk]["kind"] == kind for kind, pk in made.items())
    ray = by_id[made["raycluster"]]
    assert (ray["name"], ray["workspace"], ray["state"], ray["exit_code"], ray["failure_reason"]) == (
        "ray", "team-a", "QUEUED", None, ""
    )  # fmt: skip
    assert [(p["role"], p["replicas"], p["gpu_type"], p["gpus"]) for p in ray["podsets"]] == [
        ("head", 1, "", "0.000"), ("worker", 2, "h100", "1.000")
    ]  # fmt: skip
    assert by_id[made["notebook"]]["podsets"] == []  # a notebook holds its instance's devices


def test_a_queued_cluster_says_why_it_waits_and_where_it_stands(world: World) -> None:
    client = world.client(world.alice)
    check_submit_job(world.team_a, name="hog", command="true", gpu_type="h100", gpus_per_replica=Decimal(4),
                     acting_user=world.bob)  # fmt: skip
    run_cycle()
    cluster = check_create_cluster(world.team_a, name="tune", workers=2, gpu_type="h100", worker_gpus=Decimal(1),
                                   acting_user=world.alice)  # fmt: skip
    run_cycle()
    [row] = client.get(URL, {"kind": "raycluster", "state": "QUEUED"}).json()["results"]
    assert row["id"] == cluster.pk
    assert row["wait_reason"] == "waiting for quota: 4 of 4 h100 in use in workspace team-a, this needs 2"
    assert (row["workspace_queue_position"], row["cluster_queue_position"]) == (1, 1)
    [hog] = client.get(URL, {"kind__in": "job,instance", "state__in": "ADMITTED,RUNNING"}).json()["results"]
    assert (hog["name"], hog["created_by"], hog["cluster"]) == ("hog", "bob", "local")


def test_an_ended_cluster_carries_its_exit_code_and_reason(world: World) -> None:
    cluster = RayCluster.objects.create(workspace=world.team_a, name="ended", entrypoint="python t.py", workers=0,
                                        state=RayCluster.State.FAILED, exit_code=3, failure_reason="it crashed",
                                        started_at=timezone.now(), finished_at=timezone.now())  # fmt: skip
    [row] = world.client(world.alice).get(URL, {"name": "ended"}).json()["results"]
    assert (row["id"], row["kind"], row["state"], row["exit_code"], row["failure_reason"]) == (
        cluster.pk, "raycluster", "FAILED", 3, "it crashed"
    )  # fmt: skip


def test_another_tenants_workloads_are_neither_listed_nor_found(world: World) -> None:
    mine = _every_kind(world, world.team_a, world.alice)
    theirs = _every_kind(world, world.team_b, world.charlie, prefix="b-")
    alice = world.client(world.alice)
    assert set(mine.values()) <= _ids(alice) and not set(theirs.values()) & _ids(alice)
    assert not set(theirs.values()) & _ids(alice, kind="raycluster")
    assert _ids(alice, workspace="team-b") == set() and _ids(alice, workspace__name="team-b") == set()
    for pk in theirs.values():
        assert alice.get(f"{URL}{pk}/").status_code == 404
        assert alice.get(f"{URL}{pk}/").json() == alice.get(f"{URL}987654321/").json()
    assert alice.get(f"{URL}{mine['raycluster']}/").json()["kind"] == "raycluster"
    assert set(theirs.values()) <= _ids(world.client(world.charlie))
    assert APIClient().get(URL).status_code in (401, 403)


def test_each_caller_sees_what_each_kinds_own_list_shows_them(world: World) -> None:
    """The one list is the kinds' lists together, for every persona, a collaborator on a shared
    instance (its notebooks too) and a workload's own token."""
    _every_kind(world, world.team_a, world.alice)
    _every_kind(world, world.team_b, world.charlie, prefix="b-")
    shared = check_launch_instance(world.team_b, name="b-shared", profile=world.cpu_small, acting_user=world.charlie)
    do_set_collaborator(shared, world.alice, "read", acting_user=world.charlie)
    callers = [world.client(u) for u in (world.victor, world.bob, world.alice, world.charlie, world.admin)]
    callers.append(token_client(running_workload(world, world.alice, "job")))
    for client in callers:
        expected = set().union(*(_ids(client, url) for url in KIND_LISTS))
        assert _ids(client) == expected
    assert shared.pk in _ids(world.client(world.alice), kind="instance")


def test_a_kind_that_is_not_one_is_refused(world: World) -> None:
    client = world.client(world.alice)
    for params, field, says in (
        ({"kind": "rays"}, "kind", "Select a valid choice. rays is not one of the available choices."),
        ({"kind__in": "job,rays"}, "kind__in", "Not a choice: rays. Choose among: instance, notebook, job, raycluster"),
        ({"kind": ""}, "kind", "Choose among: instance, notebook, job, raycluster"),
    ):
        answer = client.get(URL, params)
        assert answer.status_code == 400, params
        assert list(answer.json()["error"]["fields"]) == [field]
        assert answer.json()["error"]["fields"][field][0].startswith(says)
    assert client.get(URL, {"kind__in": "job,raycluster"}).status_code == 200
    assert client.get(URL, {"kind__in": ""}).status_code == 200  # no filter, as for every list
    assert client.post(URL, {"kind": "job"}, format="json").status_code == 405


def test_it_lists_in_a_number_of_queries_independent_of_the_rows(
    world: World, django_assert_max_num_queries: Any
) -> None:
    client = world.client(world.alice)
    _every_kind(world, world.team_a, world.alice)
    with CaptureQueriesContext(connection) as few:
        _ids(client)
    do_update_workspace(world.team_a, max_instances=100, max_notebooks=100, acting_user=world.admin)
    for i in range(10):
        _every_kind(world, world.team_a, world.alice, prefix=f"m{i}-")
    with django_assert_max_num_queries(len(few)):
        assert len(_ids(client)) >= 44
