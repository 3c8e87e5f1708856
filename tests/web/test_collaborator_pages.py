"""The web pages, generated from every workspace route: someone an instance is shared with
reaches the shared instance's page, its notebooks' pages and (with write access) its kubeconfig
and a new notebook on it, and every other page of its workspace is a 404, as for another tenant;
a viewer, a read-only collaborator and another tenant change nothing through any page; and the
workspace's members manage the collaborators on the instance's page."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.core import mail
from django.test import Client
from django.urls import URLPattern

from apps.compute.models import Collaborator, Instance, Notebook
from apps.invitations.models import Invitation
from apps.jobs.actions import check_submit_job
from apps.web import urls as web_urls
from tests.api.test_collaborators import Shared
from tests.personas import World

SignedIn = Callable[[Any], Client]

# The workspace routes a collaborator may reach, given the object the route's pk names, and with
# which access. Every other route of apps/web/urls.py under w/<ws>/ answers them 404.
REACHABLE = {
    "instance": ("instance", "read"),
    "instance-kubeconfig": ("instance", "write"),
    "instance-gpu": ("instance", "read"),
    "notebook": ("notebook", "read"),
    "notebook-gpu": ("notebook", "read"),
    "notebook-delete": ("notebook", "write"),
    "notebook-new": (None, "write"),
}


def _workspace_routes() -> list[URLPattern]:
    return [p for p in web_urls.urlpatterns if str(p.pattern).startswith("w/<str:ws>/")]


def _url(pattern: URLPattern, pk: int) -> str:
    return "/" + str(pattern.pattern).replace("<str:ws>", "team-a").replace("<int:pk>", str(pk))


@pytest.fixture
def shared(world: World) -> Shared:
    return Shared(world)


@pytest.mark.parametrize("pattern", _workspace_routes(), ids=lambda p: p.name)
def test_a_collaborator_reaches_the_shared_instance_alone(
    pattern: URLPattern, world: World, shared: Shared, signed_in: SignedIn
) -> None:
    other = Instance.objects.create(workspace=world.team_a, name="other", profile=world.cpu_small)
    other_notebook = Notebook.objects.create(
        workspace=world.team_a, instance=other, name="other-nb", profile=world.minimal
    )
    reachable = REACHABLE.get(pattern.name or "")
    for user, access in ((shared.rita, "read"), (shared.wendy, "write")):
        client = signed_in(user)
        if "<int:pk>" not in str(pattern.pattern):
            status = client.get(_url(pattern, 0)).status_code
            if reachable is None:
                assert status == 404, (pattern.name, access, status)
            else:
                assert status == (200 if access == "write" else 403), (pattern.name, access, status)
            continue
        # What is not shared: not found, whatever the route. (Instances and notebooks are numbered
        # apart: an id that is also a shared one's is no test of the other kind.)
        shared_ids = {shared.instance.pk, shared.notebook.pk}
        for pk in {other.pk, other_notebook.pk} - shared_ids:  # a route for POST alone may say so first (405)
            assert client.get(_url(pattern, pk)).status_code in (404, 405), (pattern.name, access, pk)
            assert client.post(_url(pattern, pk), {"action": "remove"}).status_code == 404, (pattern.name, access)
        if reachable is None or reachable[0] is None:
            continue
        target = shared.instance if reachable[0] == "instance" else shared.notebook
        status = client.get(_url(pattern, target.pk)).status_code
        if access == "write" or reachable[1] == "read":
            assert status in (200, 404) if pattern.name == "instance-kubeconfig" else status == 200, (
                pattern.name,
                access,
                status,
            )
        else:
            assert status == 403, (pattern.name, access, status)


def test_the_shared_instance_page_says_how_it_is_shared_and_offers_what_the_access_allows(
    world: World, shared: Shared, signed_in: SignedIn
) -> None:
    url = f"/w/team-a/instances/{shared.instance.pk}/"
    rita = signed_in(shared.rita).get(url).content.decode()
    assert "Shared with you, read-only" in rita
    assert "New notebook on it" not in rita and "Delete…" not in rita
    assert 'id="collaborators"' not in rita  # who it is shared with is the members' to manage
    assert f'data-live-workspaces="instance:{shared.instance.pk}"' in rita  # hears this instance alone
    wendy = signed_in(shared.wendy).get(url).content.decode()
    assert "Shared with you, read-write" in wendy and "New notebook on it" in wendy
    assert "Delete…" not in wendy
    # The menu lists it under "Shared with you"; their own workspace stays theirs.
    assert re.search(r'Shared with you</p>\s*<a href="/w/team-a/instances/\d+/"', wendy)
    assert 'value="team-a"' not in wendy
    notebook = signed_in(shared.rita).get(f"/w/team-a/notebooks/{shared.notebook.pk}/").content.decode()
    assert shared.notebook.access_token not in notebook
    assert (
        shared.notebook.access_token
        in signed_in(shared.wendy).get(f"/w/team-a/notebooks/{shared.notebook.pk}/").content.decode()
    )


def test_a_member_shares_changes_and_removes_on_the_instance_page(
    world: World, shared: Shared, signed_in: SignedIn
) -> None:
    bob = signed_in(world.bob)  # a member of team-a
    url = f"/w/team-a/instances/{shared.instance.pk}/collaborators/"
    page = bob.get(f"/w/team-a/instances/{shared.instance.pk}/").content.decode()
    assert 'data-collaborator="rita"' in page and 'data-collaborator="wendy"' in page
    response = bob.post(url, {"action": "invite", "email": "dana@example.org", "access": "write"}, follow=True)
    assert "dana@example.org was invited to shared, read-write" in response.content.decode()
    [message] = mail.outbox
    assert message.to == ["dana@example.org"] and "the instance shared of the workspace team-a" in message.body
    invitation = Invitation.objects.get(email="dana@example.org")
    assert invitation.instance == shared.instance and invitation.access == "write" and invitation.role == ""
    assert 'data-invitation="dana@example.org"' in response.content.decode()
    # Not on the members page: that lists invitations to the workspace.
    assert "dana@example.org" not in bob.get("/w/team-a/members/").content.decode()
    bob.post(url, {"action": "access", "collaborator": shared.write.pk, "access": "read"})
    assert Collaborator.objects.get(pk=shared.write.pk).access == "read"
    bob.post(url, {"action": "remove", "collaborator": shared.read.pk})
    assert not Collaborator.objects.filter(pk=shared.read.pk).exists()
    assert signed_in(shared.rita).get(f"/w/team-a/instances/{shared.instance.pk}/").status_code == 404
    # Bad input: its field says why, nothing changes.
    bad = bob.post(url, {"action": "invite", "email": "not an address", "access": "write"})
    assert bad.status_code == 400 and "Give an email address" in bad.content.decode()
    bad = bob.post(url, {"action": "invite", "email": "erin@example.org", "access": "owner"})
    assert bad.status_code == 400 and "Choose read" in bad.content.decode()
    assert not Invitation.objects.filter(email="erin@example.org").exists()


def test_only_members_manage_collaborators(world: World, shared: Shared, signed_in: SignedIn) -> None:
    url = f"/w/team-a/instances/{shared.instance.pk}/collaborators/"
    for user in (world.victor, shared.wendy):  # a viewer of team-a; a read-write collaborator
        response = signed_in(user).post(url, {"action": "remove", "collaborator": shared.read.pk})
        assert response.status_code == 403, user
    assert signed_in(world.charlie).post(url, {"action": "remove", "collaborator": shared.read.pk}).status_code == 404
    assert Collaborator.objects.filter(pk=shared.read.pk).exists()


def _state() -> tuple[int, ...]:
    """What a refused change must leave as it was: every kind of row a page can change, and the
    audit trail."""
    from apps.audit.models import AuditEvent
    from apps.jobs.models import Job
    from apps.workspaces.models import Membership

    live = (
        Instance.objects.filter(state__in=Instance.LIVE_STATES).count(),
        Notebook.objects.filter(state__in=Notebook.LIVE_STATES).count(),
        Job.objects.exclude(state=Job.State.CANCELLED).count(),
    )
    rows = (Membership, Collaborator, Invitation, AuditEvent)
    values = (
        *Membership.objects.order_by("pk").values_list("role", flat=True),
        *Collaborator.objects.order_by("pk").values_list("access", flat=True),
        *Instance.objects.order_by("pk").values_list("description", flat=True),
        *Invitation.objects.order_by("pk").values_list("withdrawn_at", flat=True),
    )
    return (*live, *(model.objects.count() for model in rows), *values)


def _bodies(world: World, shared: Shared) -> list[dict[str, Any]]:
    """What a member would send to the workspace's pages to change something, one form each."""
    from apps.workspaces.models import Membership

    membership = Membership.objects.filter(workspace=world.team_a).first()
    invitation = Invitation.objects.create(
        workspace=world.team_a, email="guest@example.org", digest="0" * 64, expires_at="2100-01-01T00:00Z"
    )
    common = {
        "name": "evil",
        "description": "changed",
        "profile": "cpu-small",
        "instance": shared.instance.pk,
        "command": "true",
        "step": "3",
        "email": "eve@example.org",
        "username": "charlie",
        "role": "owner",
        "access": "write",
        "membership": membership.pk if membership else 0,
        "collaborator": shared.read.pk,
        "invitation": invitation.pk,
    }
    return [common] + [{**common, "action": a} for a in ("invite", "add", "role", "remove", "access", "withdraw")]


@pytest.mark.parametrize("pattern", _workspace_routes(), ids=lambda p: p.name)
def test_who_may_only_look_changes_nothing_on_any_page(
    pattern: URLPattern, world: World, shared: Shared, signed_in: SignedIn
) -> None:
    """Every workspace page, sent every form a member would send, by team-a's viewer, a read-only
    collaborator and another tenant: nothing changes, and another tenant learns nothing (404)."""
    job = check_submit_job(world.team_a, name="train", command="true", acting_user=world.alice)
    bodies = _bodies(world, shared)
    ids = {"instance": shared.instance.pk, "notebook": shared.notebook.pk, "job": job.pk}
    kind = (pattern.name or "").split("-")[0]
    url = _url(pattern, ids.get(kind, shared.instance.pk))
    clients = {user: signed_in(user) for user in (world.victor, shared.rita, world.charlie)}
    before = _state()
    for user, client in clients.items():
        for body in bodies:
            response = client.post(url, body)
            if user == world.charlie:
                assert response.status_code in (404, 405), (pattern.name, body.get("action"), response.status_code)
            else:
                assert response.status_code in (200, 400, 403, 404, 405), (pattern.name, response.status_code)
            assert _state() == before, (pattern.name, user, body.get("action"))


def test_the_overview_lists_what_is_shared_and_hears_it(world: World, shared: Shared, signed_in: SignedIn) -> None:
    other = Instance.objects.create(workspace=world.team_a, name="not-shared", profile=world.cpu_small)
    page = signed_in(shared.rita).get("/").content.decode()
    assert f"/w/team-a/instances/{shared.instance.pk}/" in page
    assert f"/w/team-a/instances/{other.pk}/" not in page
    live = re.search(r'data-live-workspaces="([^"]*)"', page)
    assert live and live.group(1).split(",") == ["rita", f"instance:{shared.instance.pk}"]
