"""Tenant isolation and roles, checked the same way on every endpoint of tests/api/endpoints.py."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import URLPattern
from rest_framework.test import APIClient

from apps.api import urls as api_urls
from apps.api.permissions import WORKLOAD_TOKEN_REFUSED
from apps.audit.models import AuditEvent
from apps.compute.models import Instance
from apps.inventory.models import GPU
from tests.api.endpoints import (
    ENDPOINTS,
    OTHER_ROUTES,
    PERSONAS,
    Endpoint,
    Write,
    rank,
    running_workload,
    token_client,
    user_of,
)
from tests.personas import PASSWORD, World

WORKLOAD_KINDS = ("job", "instance", "notebook")


def _rows(**having: Any) -> Any:
    """The table's rows for which every `having` test holds, as pytest parameters."""
    rows = [row for row in ENDPOINTS if all(test(row) for test in having.values())]
    return pytest.mark.parametrize("row", rows, ids=str)


def _snapshot(obj: Any) -> tuple[Any, ...]:
    """What a refused request must leave as it was: the object, its table, the audit trail."""
    model = type(obj)
    return (
        model._default_manager.filter(pk=obj.pk).values().first(),
        model._default_manager.count(),
        AuditEvent.objects.count(),
    )


def _send(client: APIClient, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    return getattr(client, method)(url, body, format="json") if body is not None else getattr(client, method)(url)


def _listed(client: APIClient, row: Endpoint) -> set[str]:
    response = client.get(row.list_url, {"page_size": 500})
    assert response.status_code == 200, response.json()
    return {str(item[row.key]) for item in response.json()["results"]}


def _assert_error(response: Any, *statuses: int) -> None:
    assert response.status_code in statuses, (response.status_code, response.content[:500])
    error = response.json()["error"]
    assert error["status"] == response.status_code
    assert error["code"] and error["message"]


class TestEndpoint:
    """The isolation checks, once per row of the endpoint table."""

    def test_it_has_a_row_for_every_endpoint(self) -> None:
        registered = {prefix: viewset for prefix, viewset, _ in api_urls.router.registry}
        assert set(registered) == {row.prefix for row in ENDPOINTS}, "add the new endpoint to tests/api/endpoints.py"
        for row in ENDPOINTS:
            viewset = registered[row.prefix]
            methods = set(viewset.http_method_names)
            assert (row.create is not None) == (hasattr(viewset, "create") and "post" in methods), row
            assert (row.patch is not None) == (hasattr(viewset, "partial_update") and "patch" in methods), row
            assert row.delete == (hasattr(viewset, "destroy") and "delete" in methods), row
            extra = viewset.get_extra_actions()
            assert set(row.actions + row.other_actions) == {a.url_path for a in extra if "post" in a.mapping}, row
            assert set(row.reads + row.secret_reads) == {a.url_path for a in extra if set(a.mapping) == {"get"}}, row
            assert all(action.detail for action in viewset.get_extra_actions()), "list actions: extend the table"
            assert row.lookup == getattr(viewset, "lookup_field", "pk"), row
            assert row.workload_writes == getattr(viewset, "workload_tokens_may_change", False), row
        others = {str(p.pattern) for p in api_urls.urlpatterns if isinstance(p, URLPattern)}
        assert others == set(OTHER_ROUTES), "add the new route to OTHER_ROUTES and check it here"

    @_rows(hidden=lambda row: row.tenant or row.hidden)
    def test_it_answers_for_another_tenants_object_as_for_a_missing_one(self, row: Endpoint, world: World) -> None:
        hidden = row.hidden_object(world)
        alice = world.client(world.alice)
        assert alice.get(row.detail_url(hidden)).status_code == 404
        for name in row.reads + row.secret_reads:
            _assert_error(alice.get(f"{row.detail_url(hidden)}{name}/"), 404)
        assert str(getattr(hidden, row.lookup)) not in _listed(alice, row)
        for write in row.writes(hidden):
            before = _snapshot(hidden)
            response = _send(alice, write.method, write.url, write.body)
            missing = _send(
                alice, write.method, write.url.replace(row.detail_url(hidden), row.missing_url()), write.body
            )
            assert response.status_code == missing.status_code, write.label
            if row.tenant:
                _assert_error(response, 404)
            assert _snapshot(hidden) == before, write.label

    @_rows(tenant=lambda row: row.tenant and row.create and rank(row.create_by) <= rank("alice"))
    def test_it_creates_nothing_in_another_tenants_workspace(self, row: Endpoint, world: World) -> None:
        body = row.create(world, world.team_b)  # type: ignore[misc]
        alice = world.client(world.alice)
        audit = AuditEvent.objects.count()
        response = alice.post(row.list_url, body, format="json")
        _assert_error(response, 400)
        [messages] = response.json()["error"]["fields"].values()
        assert messages[0].endswith("does not exist."), messages  # as for a workspace that does not exist
        assert AuditEvent.objects.count() == audit

    @_rows()
    def test_it_shows_team_as_objects_to_their_readers_only(self, row: Endpoint, world: World) -> None:
        obj = row.obj(world, world.team_a)
        for persona in PERSONAS:
            client = world.client(user_of(world, persona))
            response = client.get(row.detail_url(obj))
            if rank(persona) < rank(row.read_by):
                _assert_error(response, 403)
                _assert_error(client.get(row.list_url), 403)
                continue
            assert response.status_code == 200, (persona, response.json())
            for name in row.reads:  # answered (maybe a 400 for a missing parameter), never refused
                assert client.get(f"{row.detail_url(obj)}{name}/").status_code in (200, 400), (persona, name)
            for name in row.secret_reads:  # refused below the writer; answered (maybe none there yet) above
                secret = client.get(f"{row.detail_url(obj)}{name}/")
                if rank(persona) < rank(row.change_by):
                    _assert_error(secret, 403)
                else:
                    assert secret.status_code in (200, 404, 409), (persona, name, secret.content[:300])
            assert str(response.json()[row.key]) == str(getattr(obj, row.lookup))
            assert str(getattr(obj, row.lookup)) in _listed(client, row), persona

    @_rows(writes=lambda row: row.create or row.patch or row.delete or row.actions)
    def test_it_refuses_changes_below_the_writers_role(self, row: Endpoint, world: World) -> None:
        obj = row.obj(world, world.team_a)
        writes = row.writes(obj, row.create(world, world.team_a) if row.create else None)
        for persona in PERSONAS:
            client = world.client(user_of(world, persona))
            for write in writes:
                if rank(persona) >= rank(write.writer):
                    continue
                before = _snapshot(obj)
                _assert_error(_send(client, write.method, write.url, write.body), 403)
                assert _snapshot(obj) == before, (persona, write.label)

    @_rows(writes=lambda row: row.create or row.patch or row.delete or row.actions)
    def test_it_lets_the_writer_change_team_as_objects(self, row: Endpoint, world: World) -> None:
        obj = row.obj(world, world.team_a)
        create = row.create(world, world.team_a) if row.create else None
        for step in range(len(row.writes(obj, create))):
            obj.refresh_from_db()  # a PATCH may have renamed it
            write = row.writes(obj, create)[step]
            audit = AuditEvent.objects.count()
            response = _send(world.client(user_of(world, write.writer)), write.method, write.url, write.body)
            expected = 204 if write.method == "delete" else 201 if write.url == row.list_url else 200
            assert response.status_code == expected, (write, response.content[:500])
            assert AuditEvent.objects.count() > audit, f"{write.label} left no audit event"
            if write.body:
                assert {key: response.json()[key] for key in write.body} == write.body

    @_rows(writes=lambda row: not row.workload_writes and (row.create or row.patch or row.delete or row.actions))
    def test_it_refuses_every_change_to_a_workloads_token(self, row: Endpoint, world: World) -> None:
        """The tokens of an owner's and of a platform admin's job, instance and notebook in team-a
        change nothing here (memberships, sharing, invitations, the workspace and its policies...),
        whatever the role behind them: each request is refused, saying why, and changes nothing.
        The same requests of the owner themselves succeed (the test above)."""
        obj = row.obj(world, world.team_a)
        writes = row.writes(obj, row.create(world, world.team_a) if row.create else None)
        for launcher, kind in itertools.product((world.alice, world.admin), WORKLOAD_KINDS):
            client = token_client(running_workload(world, launcher, kind))
            assert client.get(row.list_url).status_code in (200, 403), (launcher, kind)  # a genuine token
            for write in writes:
                before = _snapshot(obj)
                response = _send(client, write.method, write.url, write.body)
                _assert_error(response, 403)
                assert response.json()["error"]["message"] == WORKLOAD_TOKEN_REFUSED, (launcher, kind, write.label)
                assert _snapshot(obj) == before, (launcher, kind, write.label)

    @_rows(workload=lambda row: row.workload_writes)
    @pytest.mark.parametrize("kind", WORKLOAD_KINDS)
    def test_it_lets_a_workloads_token_change_workloads(self, row: Endpoint, kind: str, world: World) -> None:
        """The same owner's tokens launch, change and end jobs, instances and notebooks, as the owner."""
        obj = row.obj(world, world.team_a)
        create = row.create(world, world.team_a) if row.create else None
        client = token_client(running_workload(world, world.alice, kind))
        for step in range(len(row.writes(obj, create))):
            obj.refresh_from_db()
            write = row.writes(obj, create)[step]
            audit = AuditEvent.objects.count()
            response = _send(client, write.method, write.url, write.body)
            expected = 204 if write.method == "delete" else 201 if write.url == row.list_url else 200
            assert response.status_code == expected, (write, response.content[:500])
            assert AuditEvent.objects.order_by("-id").first().actor == world.alice, write.label
            assert AuditEvent.objects.count() > audit, f"{write.label} left no audit event"

    @_rows()
    def test_it_refuses_anonymous_requests(self, row: Endpoint, world: World) -> None:
        obj = row.obj(world, world.team_a)
        anonymous = APIClient()
        reads = [Write("GET", "get", url, None, row.read_by) for url in (row.list_url, row.detail_url(obj))]
        requests = reads + row.writes(obj, row.create(world, world.team_a) if row.create else None)
        before = _snapshot(obj)
        for request in requests:
            response = _send(anonymous, request.method, request.url, request.body)
            _assert_error(response, 401, 403)
            assert response.json()["error"]["code"] == "not_authenticated", request.label
        assert _snapshot(obj) == before

    @_rows(more=lambda row: row.more)
    def test_it_lists_in_a_number_of_queries_independent_of_the_rows(
        self, row: Endpoint, world: World, django_assert_max_num_queries: Any
    ) -> None:
        reader = user_of(world, "admin" if rank(row.read_by) > rank("alice") else "alice")
        client = world.client(reader)
        row.more(world, range(0, 3))  # type: ignore[misc]
        few = _listed(client, row)
        with CaptureQueriesContext(connection) as queries:
            assert _listed(client, row) == few
        row.more(world, range(3, 30))  # type: ignore[misc]
        with django_assert_max_num_queries(len(queries)):
            many = _listed(client, row)
        assert len(many) >= len(few) + 27
        assert len(queries) <= 12, [q["sql"] for q in queries.captured_queries]


def test_it_refuses_anonymous_requests_for_me(world: World) -> None:
    _assert_error(APIClient().get("/api/v1/me/"), 401, 403)


def test_it_gives_a_token_without_signing_in(world: World) -> None:
    anonymous = APIClient()
    response = anonymous.post("/api/v1/auth/token/", {"username": "bob", "password": PASSWORD}, format="json")
    assert response.status_code == 200, response.json()
    anonymous.credentials(HTTP_AUTHORIZATION=f"Token {response.json()['token']}")
    assert anonymous.get("/api/v1/me/").json()["username"] == "bob"
    wrong = APIClient().post("/api/v1/auth/token/", {"username": "bob", "password": "guess"}, format="json")
    _assert_error(wrong, 401, 403)


def test_it_hides_who_holds_another_tenants_gpu(world: World, django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        mine = Instance.objects.get(pk=_launch(world, world.alice, "team-a"))
        _launch(world, world.charlie, "team-b")
    assert GPU.objects.filter(allocations__isnull=False).count() == 2
    holders = [
        allocation["holder"]
        for gpu in world.client(world.alice).get("/api/v1/gpus/").json()["results"]
        for allocation in gpu["allocations"]
    ]
    assert sorted(holders, key=bool) == [
        None,
        {"kind": "instance", "id": mine.pk, "name": "box", "workspace": "team-a", "role": "main"},
    ]


def _launch(world: World, user: Any, workspace: str) -> int:
    response = world.client(user).post(
        "/api/v1/instances/", {"workspace": workspace, "name": "box", "profile": "gpu-1"}, format="json"
    )
    assert response.status_code == 201, response.json()
    return int(response.json()["id"])


def test_it_shows_cluster_connections_to_admins_only(world: World) -> None:
    world.client(world.admin).patch("/api/v1/clusters/local/", {"connection": {"token": "s3cret"}}, format="json")
    assert "connection" not in world.client(world.alice).get("/api/v1/clusters/local/").json()
    assert world.client(world.admin).get("/api/v1/clusters/local/").json()["connection"] == {"token": "s3cret"}


def test_it_tells_each_persona_their_role_in_the_list(world: World) -> None:
    expected = {"victor": "viewer", "bob": "member", "alice": "owner", "admin": "owner"}
    for persona, role in expected.items():
        listed = world.client(user_of(world, persona)).get("/api/v1/workspaces/").json()["results"]
        assert {w["name"]: w["my_role"] for w in listed}["team-a"] == role, persona
        assert {w["name"]: w["my_role"] for w in listed}[persona] == "owner"  # their private workspace
