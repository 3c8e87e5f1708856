"""The token of a shared workload never holds one person's credential: while an instance has any
collaborator, its token and its notebooks' act only as a collaborator of that instance may (that
instance and its notebooks, read or write as the weakest collaborator holds, never more than the
launcher may), with no role in the workspace. Decided at each request, as sharing changes."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model

from apps.accounts.tokens import user_for_token, workload_token
from apps.compute.collaborators import do_remove_collaborator, do_set_collaborator
from apps.compute.models import Collaborator, Notebook
from apps.workspaces.access import role_in
from apps.workspaces.models import Membership
from tests.api.endpoints import running_workload, token_client
from tests.personas import PASSWORD, World


def _person(username: str) -> Any:
    return get_user_model().objects.create_user(username, f"{username}@example.org", PASSWORD)


def _ids(answer: Any) -> list[int]:
    assert answer.status_code == 200, answer.content
    return sorted(item["id"] for item in answer.json()["results"])


def _reach(client: Any, notebook: Notebook, others: list[Any]) -> dict[str, Any]:
    """What a token reaches: its workspace, its instance and notebook, others' objects, and
    whether it may work in the notebook (its secret shown, a change let through)."""
    instance_id = notebook.instance_id
    patched = client.patch(f"/api/v1/notebooks/{notebook.pk}/", {"description": "x"}, format="json")
    return {
        "workspaces": [w["name"] for w in client.get("/api/v1/workspaces/").json()["results"]],
        "instance": client.get(f"/api/v1/instances/{instance_id}/").status_code,
        "instances": _ids(client.get("/api/v1/instances/")),
        "notebooks": _ids(client.get("/api/v1/notebooks/")),
        "others": [client.get(f"/api/v1/{path}/{row.pk}/").status_code for path, row in others],
        "secret": client.get(f"/api/v1/notebooks/{notebook.pk}/").json().get("access_token") is not None,
        "writes": patched.status_code,
    }


def test_a_shared_instances_tokens_act_as_its_weakest_collaborator(world: World) -> None:
    notebook = running_workload(world, world.alice, "notebook")
    box = notebook.instance
    other = running_workload(world, world.alice, "instance")
    job = running_workload(world, world.alice, "job")
    others = [("instances", other), ("jobs", job)]
    tokens = {"instance": token_client(box), "notebook": token_client(notebook)}

    # Not shared: it acts for alice in team-a (and reaches the rest of it).
    for client in tokens.values():
        reach = _reach(client, notebook, others)
        assert reach["workspaces"] == ["team-a"] and reach["others"] == [200, 200], reach

    wendy, rita = _person("wendy"), _person("rita")
    wendys = do_set_collaborator(box, wendy, "write", acting_user=world.alice)
    for kind, client in tokens.items():
        reach = _reach(client, notebook, others)
        assert reach == {"workspaces": [], "instance": 200, "instances": [box.pk], "notebooks": [notebook.pk],
                         "others": [404, 404], "secret": True, "writes": 200}, (kind, reach)  # fmt: skip
        # As a collaborator: nothing changes the instance itself, nothing is launched in the workspace.
        assert client.patch(f"/api/v1/instances/{box.pk}/", {"description": "x"}, format="json").status_code == 403
        job = client.post("/api/v1/jobs/", {"workspace": "team-a", "name": "sneak", "command": "true"}, format="json")
        assert job.status_code == 400, job.content
    assert role_in(user_for_token(workload_token(notebook) or ""), world.team_a) is None

    rita_reads = do_set_collaborator(box, rita, "read", acting_user=world.alice)
    for kind, client in tokens.items():
        reach = _reach(client, notebook, others)
        assert (reach["instance"], reach["secret"], reach["writes"]) == (200, False, 403), (kind, reach)

    # Sharing ends: it acts for alice in team-a again.
    do_remove_collaborator(rita_reads, acting_user=world.alice)
    do_remove_collaborator(wendys, acting_user=world.alice)
    for client in tokens.values():
        reach = _reach(client, notebook, others)
        assert reach["workspaces"] == ["team-a"] and reach["others"] == [200, 200] and reach["writes"] == 200


def test_a_token_acts_no_further_than_its_launcher_may(world: World) -> None:
    """wendy's notebook on alice's shared instance: what wendy may do there, at most."""
    host = running_workload(world, world.alice, "notebook")
    box = host.instance
    notebook = Notebook.objects.create(
        workspace=world.team_a, instance=box, name="wendys", profile=world.minimal, created_by=_person("wendy")
    )
    Notebook.objects.filter(pk=notebook.pk).update(state=Notebook.State.READY)
    notebook.refresh_from_db()
    wendy = notebook.created_by
    walt = do_set_collaborator(box, _person("walt"), "write", acting_user=world.alice)
    wendys = do_set_collaborator(box, wendy, "write", acting_user=world.alice)
    client = token_client(notebook)
    assert _reach(client, notebook, [])["writes"] == 200

    do_set_collaborator(box, wendy, "read", acting_user=world.alice)  # walt still writes
    assert _reach(client, notebook, [])["writes"] == 403
    do_remove_collaborator(wendys, acting_user=world.alice)
    reach = _reach(client, notebook, [])
    assert (reach["instance"], reach["instances"], reach["notebooks"]) == (404, [], []), reach
    do_remove_collaborator(walt, acting_user=world.alice)  # not shared: wendy in team-a, where she is no one
    assert _reach(client, notebook, [])["instance"] == 404


def test_an_admins_token_on_a_shared_instance_is_confined_too(world: World) -> None:
    box = running_workload(world, world.admin, "instance")
    other = running_workload(world, world.alice, "instance")
    do_set_collaborator(box, _person("wendy"), "write", acting_user=world.admin)
    client = token_client(box)
    assert client.get("/api/v1/workspaces/").json()["results"] == []
    assert client.get(f"/api/v1/instances/{other.pk}/").status_code == 404
    assert _ids(client.get("/api/v1/instances/")) == [box.pk]
    assert client.get("/api/v1/users/").status_code == 403


def test_a_shared_workloads_token_cannot_make_its_collaborator_an_owner(world: World) -> None:
    """The reported attack: a read-write collaborator of alice's instance takes the token from the
    notebook's kernel and makes herself an owner of team-a. Refused, whether shared or not."""
    notebook = running_workload(world, world.alice, "notebook")
    wendy = _person("wendy")
    do_set_collaborator(notebook.instance, wendy, "write", acting_user=world.alice)
    for shared in (True, False):
        if not shared:
            Collaborator.objects.filter(instance=notebook.instance).delete()
        client = token_client(notebook)
        body = {"workspace": "team-a", "user": "wendy", "role": "owner"}
        answer = client.post("/api/v1/memberships/", body, format="json")
        assert answer.status_code == 403, (shared, answer.content)
        assert not Membership.objects.filter(user=wendy).exists()
