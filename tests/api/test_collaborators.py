"""Collaborators, over every endpoint of tests/api/endpoints.py: someone an instance is shared with
reaches that instance, its notebooks and (with write access) its kubeconfig, and nothing else of
its workspace; a removal takes effect with their next request."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from apps.accounts.tokens import workload_token
from apps.audit.models import AuditEvent
from apps.compute.actions import check_launch_notebook
from apps.compute.collaborators import do_remove_collaborator, do_set_collaborator
from apps.compute.models import Collaborator, Instance, Notebook
from apps.workspaces.access import USE, VIEW, may
from apps.workspaces.actions import do_update_workspace
from tests.api.endpoints import ENDPOINTS, Endpoint, instance
from tests.personas import PASSWORD, World


class Shared:
    """team-a's instance `shared`, with a notebook on it, shared with rita (read) and wendy (write)."""

    def __init__(self, world: World) -> None:
        do_update_workspace(world.team_a, max_instances=10, max_notebooks=10, acting_user=world.admin)
        self.instance = instance(world, world.team_a, "shared")
        self.notebook = _notebook_on(world, self.instance, "shared-nb")
        users = get_user_model().objects
        self.rita = users.create_user("rita", "rita@example.org", PASSWORD)
        self.wendy = users.create_user("wendy", "wendy@example.org", PASSWORD)
        self.read = do_set_collaborator(self.instance, self.rita, "read", acting_user=world.alice)
        self.write = do_set_collaborator(self.instance, self.wendy, "write", acting_user=world.alice)


def _notebook_on(world: World, host: Instance, name: str) -> Notebook:
    return check_launch_notebook(
        host.workspace, instance=host, name=name, profile=world.minimal, acting_user=world.alice
    )


@pytest.fixture
def shared(world: World) -> Shared:
    return Shared(world)


def _snapshot(obj: Any) -> tuple[Any, ...]:
    model = type(obj)
    return model._default_manager.filter(pk=obj.pk).values().first(), model._default_manager.count()


def _send(client: Any, method: str, url: str, body: dict[str, Any] | None) -> Any:
    return getattr(client, method)(url, body, format="json") if body is not None else getattr(client, method)(url)


@pytest.mark.parametrize("row", [row for row in ENDPOINTS if row.tenant], ids=str)
def test_a_collaborator_finds_nothing_else_of_the_workspace(row: Endpoint, world: World, shared: Shared) -> None:
    """Every tenant endpoint: team-a's object that was not shared is, to both collaborators, as
    another tenant's: not found, not listed, not changed."""
    obj = row.obj(world, world.team_a)
    clients = {user: world.client(user) for user in (shared.rita, shared.wendy)}
    writes = row.writes(obj, row.create(world, world.team_a) if row.create else None)
    audit = AuditEvent.objects.count()
    for user, client in clients.items():
        assert client.get(row.detail_url(obj)).status_code == 404, (user, row)
        for name in row.reads + row.secret_reads:
            assert client.get(f"{row.detail_url(obj)}{name}/").status_code == 404, (user, name)
        listed = client.get(row.list_url, {"page_size": 500})
        assert listed.status_code == 200
        assert str(getattr(obj, row.lookup)) not in {str(item[row.key]) for item in listed.json()["results"]}
        for write in writes:
            before = _snapshot(obj)
            response = _send(client, write.method, write.url, write.body)
            if write.url == row.list_url:  # creating in team-a: as in a workspace that does not exist
                assert response.status_code in (400, 403), (user, write.label, response.content[:300])
            else:
                assert response.status_code == 404, (user, write.label, response.content[:300])
            assert _snapshot(obj) == before, (user, write.label)
    assert AuditEvent.objects.count() == audit


def test_both_see_the_shared_instance_and_its_notebooks_and_nothing_beside(world: World, shared: Shared) -> None:
    other = instance(world, world.team_a, "other")
    for user in (shared.rita, shared.wendy):
        client = world.client(user)
        assert client.get(f"/api/v1/instances/{shared.instance.pk}/").status_code == 200
        listed = {i["id"] for i in client.get("/api/v1/instances/").json()["results"]}
        assert shared.instance.pk in listed and other.pk not in listed
        assert client.get(f"/api/v1/notebooks/{shared.notebook.pk}/").status_code == 200
        assert client.get("/api/v1/workspaces/team-a/").status_code == 404
        assert "team-a" not in {w["name"] for w in client.get("/api/v1/workspaces/").json()["results"]}
        # Who else it is shared with, but no way to change that.
        peers = client.get("/api/v1/collaborators/", {"instance": shared.instance.pk}).json()["results"]
        assert {p["user"] for p in peers} == {"rita", "wendy"}
        assert (
            client.patch(f"/api/v1/collaborators/{shared.read.pk}/", {"access": "write"}, format="json").status_code
            == 403
        )
        assert client.delete(f"/api/v1/collaborators/{shared.write.pk}/").status_code == 403
        # The instance itself is the workspace's: neither changes nor deletes it, nor shares it on.
        assert (
            client.patch(f"/api/v1/instances/{shared.instance.pk}/", {"description": "x"}, format="json").status_code
            == 403
        )
        assert client.delete(f"/api/v1/instances/{shared.instance.pk}/").status_code == 403
        invite = {"instance": shared.instance.pk, "email": "eve@example.org", "access": "write"}
        assert client.post("/api/v1/invitations/", invite, format="json").status_code == 403
    Instance.objects.get(pk=shared.instance.pk, state=Instance.State.QUEUED)
    assert not Collaborator.objects.filter(user__email="eve@example.org").exists()


def test_write_access_opens_starts_and_stops_notebooks_and_takes_the_kubeconfig(world: World, shared: Shared) -> None:
    rita, wendy = world.client(shared.rita), world.client(shared.wendy)
    url = f"/api/v1/notebooks/{shared.notebook.pk}/"
    assert rita.get(url).json()["access_token"] is None
    assert wendy.get(url).json()["access_token"] == shared.notebook.access_token
    kubeconfig = f"/api/v1/instances/{shared.instance.pk}/kubeconfig/"
    assert rita.get(kubeconfig).status_code == 403
    assert wendy.get(kubeconfig).status_code in (404, 409)  # allowed: the local backend issues none
    body = {"instance": shared.instance.pk, "name": "wendys", "profile": "minimal"}
    assert rita.post("/api/v1/notebooks/", body, format="json").status_code == 403
    made = wendy.post("/api/v1/notebooks/", body, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["workspace"] == "team-a"
    assert rita.delete(f"/api/v1/notebooks/{made.json()['id']}/").status_code == 403
    assert wendy.delete(f"/api/v1/notebooks/{made.json()['id']}/").status_code == 204
    # Not on another instance of the workspace, whatever the body says.
    other = instance(world, world.team_a, "other")
    elsewhere = wendy.post("/api/v1/notebooks/", {**body, "instance": other.pk}, format="json")
    assert elsewhere.status_code == 400 and "instance" in elsewhere.json()["error"]["fields"]


def test_a_removal_or_a_lowered_access_takes_effect_at_the_next_request(world: World, shared: Shared) -> None:
    wendy = world.client(shared.wendy)
    url = f"/api/v1/notebooks/{shared.notebook.pk}/"
    assert wendy.get(url).json()["access_token"]
    owner = world.client(world.bob)  # a member of team-a
    assert (
        owner.patch(f"/api/v1/collaborators/{shared.write.pk}/", {"access": "read"}, format="json").status_code == 200
    )
    assert wendy.get(url).json()["access_token"] is None
    assert not may(shared.wendy, shared.notebook, USE)
    assert owner.delete(f"/api/v1/collaborators/{shared.write.pk}/").status_code == 204
    assert wendy.get(url).status_code == 404
    assert wendy.get(f"/api/v1/instances/{shared.instance.pk}/").status_code == 404
    assert not may(shared.wendy, shared.instance, VIEW)
    events = AuditEvent.objects.filter(target_type="compute.collaborator", target_id=str(shared.write.pk))
    assert list(events.order_by("id").values_list("action", "actor__username")) == [
        ("collaborator.set", "alice"),
        ("collaborator.set", "bob"),
        ("collaborator.remove", "bob"),
    ]


def test_a_workload_token_of_a_collaborator_carries_none_of_her_shares(world: World, shared: Shared) -> None:
    """A workload's token carries none of its user's collaborations: the notebook wendy starts on
    the shared instance acts on that instance alone, as its weakest collaborator may (rita: read),
    and reaches neither another instance shared with wendy nor anything else of the workspace."""
    wendys = _notebook_on(world, shared.instance, "wendys")
    Notebook.objects.filter(pk=wendys.pk).update(created_by=shared.wendy, state=Notebook.State.READY)
    wendys.refresh_from_db()
    elsewhere = instance(world, world.team_a, "also-shared")
    do_set_collaborator(elsewhere, shared.wendy, "write", acting_user=world.alice)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {workload_token(wendys)}")
    assert client.get("/api/v1/me/").status_code == 200  # a genuine token
    assert client.get(f"/api/v1/instances/{shared.instance.pk}/").status_code == 200
    assert client.get(f"/api/v1/notebooks/{wendys.pk}/").json()["access_token"] is None  # read only
    assert client.get(f"/api/v1/instances/{elsewhere.pk}/").status_code == 404
    assert [i["id"] for i in client.get("/api/v1/instances/").json()["results"]] == [shared.instance.pk]
    assert client.get("/api/v1/workspaces/").json()["results"] == []


def test_an_ended_instance_is_shared_no_more(world: World, shared: Shared) -> None:
    do_remove_collaborator(shared.read, acting_user=world.alice)
    Instance.objects.filter(pk=shared.instance.pk).update(state=Instance.State.DELETED)
    with pytest.raises(Exception, match="has ended"):
        do_set_collaborator(shared.instance, shared.rita, "read", acting_user=world.alice)


def test_an_unknown_access_is_refused_with_its_field(world: World, shared: Shared) -> None:
    response = world.client(world.bob).patch(
        f"/api/v1/collaborators/{shared.read.pk}/", {"access": "admin"}, format="json"
    )
    assert response.status_code == 400
    assert "access" in response.json()["error"]["fields"]
    assert Collaborator.objects.get(pk=shared.read.pk).access == "read"
