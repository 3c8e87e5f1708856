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
