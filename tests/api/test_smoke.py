from decimal import Decimal

from apps.jobs.actions import check_submit_job
from apps.scheduling.adapter import run_cycle
from tests.personas import World


def test_it_lists_only_my_workspaces(world: World) -> None:
    response = world.client(world.alice).get("/api/v1/workspaces/")
    assert response.status_code == 200
    names = {w["name"] for w in response.json()["results"]}
    assert names == {"alice", "team-a"}


def test_it_launches_and_admits_an_instance(world: World, django_capture_on_commit_callbacks) -> None:
    client = world.client(world.alice)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            "/api/v1/instances/", {"workspace": "team-a", "name": "box-1", "profile": "gpu-1"}, format="json"
        )
    assert response.status_code == 201, response.json()
    detail = client.get(f"/api/v1/instances/{response.json()['id']}/").json()
    assert detail["state"] == "PROVISIONING"
    assert detail["cluster"] == "local"


def test_it_shows_gpus_in_use_against_each_quota(world: World) -> None:
    check_submit_job(
        world.team_a, name="train", command="true", gpu_type="h100", gpus_per_replica=Decimal("3"),
        replicas=1, acting_user=world.alice,
    )  # fmt: skip
    run_cycle()
    admin = world.client(world.admin)
    listed = {(q["workspace"], q["gpu_type"]): q["in_use"] for q in admin.get("/api/v1/quotas/").json()["results"]}
    assert listed[("team-a", "h100")] == "3.00"
    workspace = admin.get("/api/v1/workspaces/team-a/").json()
    assert workspace["gpu_quotas"][0]["in_use"] == "3.00"
    created = admin.post("/api/v1/quotas/", {"workspace": "team-a", "gpu_type": "h100", "gpus": "6"}, format="json")
    assert created.json()["in_use"] == "3.00"
