"""The members page: members see who is in their workspace; owners add people, change roles and
remove them through the workspace actions (audited, the last owner kept); a member's forged
change is refused, another tenant finds nothing, and the form needs its CSRF token."""

from __future__ import annotations

from django.test import Client

from apps.audit.models import AuditEvent
from apps.workspaces.models import Membership, Role
from tests.personas import World
from tests.web.conftest import queries
from tests.web.test_pages import SignedIn

URL = "/w/team-a/members/"


def test_a_member_and_a_viewer_see_the_members_read_only(world: World, signed_in: SignedIn) -> None:
    for user in (world.bob, world.victor):
        page = signed_in(user).get(URL)
        assert page.status_code == 200
        text = page.content.decode()
        assert 'data-member="alice"' in text and 'data-member="victor"' in text
        assert "<form" not in text.split('<main id="main"', 1)[1], user  # nothing to change with
        assert "Only the workspace's owners change who is in it." in text
        assert '<a href="/w/team-a/members/" aria-current="page">Members</a>' in text  # in the workspace's navigation


def test_an_owner_sees_the_forms_and_the_list_costs_the_same_for_more_members(
    world: World, signed_in: SignedIn
) -> None:
    alice = signed_in(world.alice)
    text = alice.get(URL).content.decode()
    assert 'aria-label="Add someone"' in text
    assert '<button class="btn btn-small" type="submit">Remove<span class="visually-hidden"> victor</span>' in text
    few = queries(alice, URL)
    Membership.objects.create(workspace=world.team_a, user=world.bob, role=Role.MEMBER)
    Membership.objects.create(workspace=world.team_a, user=world.charlie, role=Role.VIEWER)
    assert queries(alice, URL) == few


def test_an_owner_adds_changes_and_removes_members_through_the_actions(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    added = alice.post(URL, {"action": "add", "username": "charlie", "role": "viewer"})
    assert added.status_code == 302
    charlie = Membership.objects.get(workspace=world.team_a, user=world.charlie)
    assert charlie.role == Role.VIEWER
    assert "charlie&#x27;s role in team-a is now viewer." in alice.get(URL).content.decode()
    assert alice.post(URL, {"action": "role", "membership": charlie.pk, "role": "member"}).status_code == 302
    charlie.refresh_from_db()
    assert charlie.role == Role.MEMBER
    assert alice.post(URL, {"action": "remove", "membership": charlie.pk}).status_code == 302
    assert not Membership.objects.filter(pk=charlie.pk).exists()
    events = AuditEvent.objects.filter(action__startswith="membership.").order_by("pk")
    actions = list(events.values_list("action", "via"))
    assert actions == [("membership.set", "web"), ("membership.set", "web"), ("membership.remove", "web")]


def test_a_platform_admin_manages_members_of_any_workspace(world: World, signed_in: SignedIn) -> None:
    admin = signed_in(world.admin)
    assert 'aria-label="Add someone"' in admin.get("/w/team-b/members/").content.decode()
    assert admin.post("/w/team-b/members/", {"action": "add", "username": "bob", "role": "owner"}).status_code == 302
    added = Membership.objects.get(workspace=world.team_b, user=world.bob)
    assert added.role == Role.OWNER
    event = AuditEvent.objects.get(action="membership.set")
    assert (event.actor, event.via) == (world.admin, "web")


def test_the_last_owner_stays_and_a_bad_name_is_said(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    own = Membership.objects.get(workspace=world.team_a, user=world.alice)
    kept = alice.post(URL, {"action": "remove", "membership": own.pk})
    assert kept.status_code == 400 and "is the last owner of team-a" in kept.content.decode()
    demoted = alice.post(URL, {"action": "role", "membership": own.pk, "role": "viewer"}).content.decode()
    # Said above the table, not under the add form's role, which keeps its own default.
    assert '<div class="form-error" role="alert"><p>alice is the last owner of team-a.</p></div>' in demoted
    assert 'id="role-error"' not in demoted and '<option value="member" selected>' in demoted.split('id="id_role"')[1]
    nobody = alice.post(URL, {"action": "add", "username": "nobody", "role": "member"})
    assert nobody.status_code == 400 and "No active user is named &#x27;nobody&#x27;." in nobody.content.decode()
    assert Membership.objects.filter(pk=own.pk, role=Role.OWNER).exists()


def test_a_member_cannot_change_members_and_another_tenant_finds_nothing(world: World, signed_in: SignedIn) -> None:
    victor = Membership.objects.get(workspace=world.team_a, user=world.victor)
    bob = signed_in(world.bob)  # a member through the group, not an owner
    assert bob.post(URL, {"action": "role", "membership": victor.pk, "role": "owner"}).status_code == 403
    assert bob.post(URL, {"action": "add", "username": "bob", "role": "owner"}).status_code == 403
    charlie = signed_in(world.charlie)  # team-b
    assert charlie.get(URL).status_code == 404
    assert charlie.post(URL, {"action": "remove", "membership": victor.pk}).status_code == 404
    # An owner of team-b cannot reach team-a's membership by its id through team-b's page.
    Membership.objects.create(workspace=world.team_b, user=world.charlie, role=Role.OWNER)
    other = charlie.post("/w/team-b/members/", {"action": "remove", "membership": victor.pk})
    assert other.status_code == 404
    victor.refresh_from_db()
    assert victor.role == Role.VIEWER


def test_changes_need_the_csrf_token(world: World) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.alice)
    assert client.post(URL, {"action": "add", "username": "charlie", "role": "member"}).status_code == 403
    assert not Membership.objects.filter(workspace=world.team_a, user=world.charlie).exists()


def test_the_only_owner_is_not_offered_a_remove_button(world: World, signed_in: SignedIn) -> None:
    """Removing the last owner is refused: the page does not offer it, and offers it again once
    another owner shares the workspace."""
    alice = signed_in(world.alice)
    remove_alice = '<button class="btn btn-small" type="submit">Remove<span class="visually-hidden"> alice</span>'
    alone = alice.get(URL).content.decode()
    row = alone.split('data-member="alice"')[1].split("</tr>")[0]
    assert remove_alice not in alone and "The last owner stays" in row
    assert '<span class="visually-hidden"> victor</span></button>' in alone  # a viewer may still be removed
    victor = Membership.objects.get(user=world.victor, workspace=world.team_a)
    alice.post(URL, {"action": "role", "membership": victor.pk, "role": "owner"})
    two = alice.get(URL).content.decode()
    assert remove_alice in two and "The last owner stays" not in two
