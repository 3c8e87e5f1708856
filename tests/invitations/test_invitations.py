"""Invitations by email, sent through a real SMTP server on loopback (aiosmtpd): the mail and its
link, accepting with a new account or an existing one, and every way a link stops working: used,
expired, withdrawn, sent again, opened by the wrong account; owners only; limits per hour; a mail
server that is down."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.invitations.actions import Gone, do_accept
from apps.invitations.models import Invitation
from apps.workspaces.models import Membership, Role
from tests.mail import Mailbox, body_of, smtp_server
from tests.personas import PASSWORD, World

LINK = re.compile(r"http://testserver(/invitations/[A-Za-z0-9_-]+/)")


@pytest.fixture
def mailbox(settings: Any) -> Iterator[Mailbox]:
    with smtp_server() as box:
        for name, value in box.settings().items():
            setattr(settings, name, value)
        yield box


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user, backend="apps.accounts.oidc.PasswordBackend")
    return client


def invite(world: World, email: str, role: str = "member", *, by: Any = None) -> Any:
    return signed_in(by or world.alice).post("/w/team-a/members/", {"action": "invite", "email": email, "role": role})


def link_in(mailbox: Mailbox, number: int = 1) -> str:
    """The link in the `number`th message received (waiting for it)."""
    text = body_of(mailbox.wait_for(number)[number - 1])
    found = LINK.search(text)
    assert found, text
    return found.group(1)


def test_an_invitation_mails_a_link_that_makes_an_account_and_gives_the_role(world: World, mailbox: Mailbox) -> None:
    answer = invite(world, "Dana@Example.org")
    assert answer.status_code == 302
    [message] = mailbox.wait_for(1)
    assert message["To"].casefold() == message["X-Envelope-To"].casefold() == "dana@example.org"
    assert message["Subject"] == "alice invited you to team-a on GPU Portal"
    assert "as member" in body_of(message) and "works once, for this address (Dana@Example.org) only" in body_of(
        message
    )
    link = link_in(mailbox)
    invitation = Invitation.objects.get(email="Dana@Example.org")
    assert link.split("/")[2] not in str(Invitation.objects.values_list("digest", flat=True))  # kept hashed

    stranger = Client()
    page = stranger.get(link)
    assert page.status_code == 200
    text = page.content.decode()
    assert "invited <strong>Dana@Example.org</strong> to the workspace <strong>team-a</strong> as member" in text
    assert "Make my account and accept" in text
    made = stranger.post(link, {"action": "create", "username": "dana", "password": PASSWORD, "password2": PASSWORD})
    assert made.status_code == 302 and made["Location"] == "/w/team-a/"
    dana = get_user_model().objects.get(username="dana")
    assert dana.email == "Dana@example.org" and dana.check_password(PASSWORD)  # the domain normalised
    assert Membership.objects.get(workspace=world.team_a, user=dana).role == Role.MEMBER
    welcome = stranger.get("/w/team-a/")
    assert welcome.status_code == 200  # signed in, and a member
    assert "You are now a member of team-a." in welcome.content.decode()
    invitation.refresh_from_db()
    assert invitation.state == "accepted" and invitation.accepted_by == dana
    actions = set(AuditEvent.objects.filter(workspace=world.team_a).values_list("action", flat=True))
    assert {"invitation.create", "invitation.accept", "membership.set"} <= actions

    again = Client().get(link)
    assert again.status_code == 410 and "accepted already" in again.content.decode()


def test_an_existing_account_with_the_address_signs_in_and_accepts_without_losing_a_higher_role(
    world: World, mailbox: Mailbox
) -> None:
    invite(world, "CHARLIE@example.org", "owner")  # charlie@example.org, of team-b
    link = link_in(mailbox)
    page = Client().get(link).content.decode()
    assert "Make my account" not in page and f'/login/?next={link}"' in page

    charlie = signed_in(world.charlie)
    assert "Accept as charlie" in charlie.get(link).content.decode()
    accepted = charlie.post(link, {"action": "accept"}, follow=True)
    assert accepted.redirect_chain[0][1] == 302
    assert "You are now an owner of team-a." in accepted.content.decode()
    assert Membership.objects.get(workspace=world.team_a, user=world.charlie).role == Role.OWNER

    invite(world, "bob@example.org", "viewer")  # bob is a member through team-a's group, with no role of his own
    Membership.objects.create(workspace=world.team_a, user=world.bob, role=Role.OWNER)  # made owner meanwhile
    bob = signed_in(world.bob)
    assert bob.post(link_in(mailbox, 2), {"action": "accept"}).status_code == 302
    assert Membership.objects.get(workspace=world.team_a, user=world.bob).role == Role.OWNER  # not lowered


def test_a_link_opened_by_another_account_is_refused(world: World, mailbox: Mailbox) -> None:
    invite(world, "dana@example.org")
    link = link_in(mailbox)
    charlie = signed_in(world.charlie)
    page = charlie.get(link)
    assert page.status_code == 403
    assert "This invitation is for dana@example.org, and you are signed in as charlie" in page.content.decode()
    refused = charlie.post(link, {"action": "accept"})
    assert refused.status_code == 400
    assert not Membership.objects.filter(workspace=world.team_a, user=world.charlie).exists()
    assert charlie.get("/w/team-a/").status_code == 404
    assert Invitation.objects.get(email="dana@example.org").state == "pending"  # still good for dana


def test_expired_withdrawn_resent_and_made_up_links_stop_working(world: World, mailbox: Mailbox) -> None:
    invite(world, "erin@example.org")
    first = link_in(mailbox)
    invitation = Invitation.objects.get(email="erin@example.org")
    alice = signed_in(world.alice)
    resent = alice.post("/w/team-a/members/", {"action": "resend", "invitation": invitation.pk}, follow=True)
    assert "was sent again, with a new link" in resent.content.decode()
    second = link_in(mailbox, 2)
    assert second != first
    old = Client().get(first)  # it no longer works, and says why
    assert old.status_code == 410 and "replaced by a newer one" in old.content.decode()
    assert "copied whole" not in old.content.decode()
    assert Client().get(second).status_code == 200
    alice.post("/w/team-a/members/", {"action": "resend", "invitation": invitation.pk})
    third = link_in(mailbox, 3)
    for replaced in (first, second):  # every earlier link, not only the last one
        made = Client().post(
            replaced, {"action": "create", "username": "erin", "password": PASSWORD, "password2": PASSWORD}
        )
        assert made.status_code == 410 and "replaced by a newer one" in made.content.decode()
        assert not get_user_model().objects.filter(username="erin").exists()
    erin = get_user_model().objects.create_user("erin", "erin@example.org", PASSWORD)
    with pytest.raises(Gone, match="replaced by a newer one"):  # not even for the invited address
        do_accept(first.split("/")[-2], erin)
    assert Invitation.objects.get(pk=invitation.pk).state == "pending"
    erin.delete()
    second = third

    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    expired = Client().get(second)
    assert expired.status_code == 410 and "has expired" in expired.content.decode()

    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() + timedelta(days=1))
    alice.post("/w/team-a/members/", {"action": "withdraw", "invitation": invitation.pk})
    withdrawn = Client().get(second)
    assert withdrawn.status_code == 410 and "was withdrawn" in withdrawn.content.decode()
    made = Client().post(second, {"action": "create", "username": "erin", "password": PASSWORD, "password2": PASSWORD})
    assert made.status_code == 410 and not get_user_model().objects.filter(username="erin").exists()

    for made_up in ("/invitations/nope/", "/invitations/" + "x" * 200 + "/", "/invitations/%00/"):
        page = Client().get(made_up)
        assert page.status_code == 404 and "not valid" in page.content.decode(), made_up


def test_only_owners_invite_and_the_page_lists_what_waits(world: World, mailbox: Mailbox) -> None:
    assert invite(world, "dana@example.org", by=world.bob).status_code == 403  # a member
    assert invite(world, "dana@example.org", by=world.charlie).status_code == 404  # another tenant
    assert not Invitation.objects.exists() and not mailbox.received

    invite(world, "dana@example.org", "viewer")
    page = signed_in(world.alice).get("/w/team-a/members/").content.decode()
    assert 'data-invitation="dana@example.org"' in page and "Waiting" in page
    again = invite(world, "DANA@example.org")
    assert again.status_code == 400 and "has an invitation to team-a waiting" in again.content.decode()
    member = invite(world, "alice@example.org")
    assert member.status_code == 400 and "is a member of team-a already" in member.content.decode()
    bad = invite(world, "not an address")
    assert bad.status_code == 400 and "Give an email address" in bad.content.decode()
    assert "Waiting" not in signed_in(world.bob).get("/w/team-a/members/").content.decode()  # owners' business


def test_invitations_are_limited_per_user_and_per_workspace_each_hour(
    world: World, mailbox: Mailbox, settings: Any
) -> None:
    settings.PORTAL_INVITATIONS_PER_USER_HOUR = 2
    settings.PORTAL_INVITATIONS_PER_WORKSPACE_HOUR = 3
    api = world.client(world.alice)
    for n in range(2):
        body = {"workspace": "team-a", "email": f"p{n}@example.org"}
        assert api.post("/api/v1/invitations/", body, format="json").status_code == 201
    refused = api.post("/api/v1/invitations/", {"workspace": "team-a", "email": "p2@example.org"}, format="json")
    assert refused.status_code == 429 and 3000 < int(refused["Retry-After"]) <= 3600
    assert "2 invitations an hour is the most you may send" in refused.json()["error"]["message"]
    page = invite(world, "p2@example.org")
    assert page.status_code == 400 and "2 invitations an hour" in page.content.decode()
    resend = api.post(f"/api/v1/invitations/{Invitation.objects.first().pk}/resend/")  # type: ignore[union-attr]
    assert resend.status_code == 429  # sending again counts too

    admin = world.client(world.admin)
    third = admin.post("/api/v1/invitations/", {"workspace": "team-a", "email": "p3@example.org"}, format="json")
    assert third.status_code == 201
    full = admin.post("/api/v1/invitations/", {"workspace": "team-a", "email": "p4@example.org"}, format="json")
    assert full.status_code == 429 and "workspace team-a" in full.json()["error"]["message"]
    assert len(mailbox.wait_for(3)) == 3


def test_a_mail_server_that_is_down_leaves_the_invitation_to_send_again(world: World, settings: Any) -> None:
    with smtp_server() as box:
        port = box.port
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_USE_TLS = "127.0.0.1", port, False
    answer = signed_in(world.alice).post(
        "/w/team-a/members/", {"action": "invite", "email": "dana@example.org", "role": "member"}, follow=True
    )
    assert "but the mail could not be sent (ConnectionRefusedError" in answer.content.decode()
    invitation = Invitation.objects.get(email="dana@example.org")
    assert invitation.sent_at is None and invitation.send_error.startswith("ConnectionRefusedError")
    assert "Not sent" in signed_in(world.alice).get("/w/team-a/members/").content.decode()


def test_with_single_sign_on_the_link_asks_to_sign_in_there(world: World, mailbox: Mailbox, settings: Any) -> None:
    settings.PORTAL_OIDC_ISSUER = "https://login.example.org"
    settings.PORTAL_OIDC_CLIENT_ID, settings.PORTAL_OIDC_CLIENT_SECRET = "portal", "secret"
    invite(world, "dana@example.org")
    link = link_in(mailbox)
    page = Client().get(link).content.decode()
    assert "Make my account" not in page and f'href="/sso/start/?next={link}"' in page
    made = Client().post(link, {"action": "create", "username": "dana", "password": PASSWORD, "password2": PASSWORD})
    assert made.status_code == 400 and not get_user_model().objects.filter(username="dana").exists()


def test_an_invitation_to_an_instance_shares_it_alone_until_withdrawn_or_removed(
    world: World, mailbox: Mailbox
) -> None:
    """A member shares one instance by email: the invitee gets that instance (read-write here)
    and nothing else of team-a; a second invitation, withdrawn, stops working; removing the
    collaborator ends their access."""
    from apps.compute.actions import check_launch_instance
    from apps.compute.models import Collaborator

    box = check_launch_instance(world.team_a, name="box", profile=world.cpu_small, acting_user=world.alice)
    bob = signed_in(world.bob)  # a member, not an owner: members share instances
    url = f"/w/team-a/instances/{box.pk}/collaborators/"
    assert bob.post(url, {"action": "invite", "email": "dana@example.org", "access": "write"}).status_code == 302
    [message] = mailbox.wait_for(1)
    assert message["Subject"] == "bob invited you to instance box of team-a on GPU Portal"
    assert "the instance box of the workspace team-a" in body_of(message)
    link = link_in(mailbox)
    stranger = Client()
    page = stranger.get(link).content.decode()
    assert "to the instance <strong>box</strong> of the workspace <strong>team-a</strong>" in page
    made = stranger.post(link, {"action": "create", "username": "dana", "password": PASSWORD, "password2": PASSWORD})
    assert made.status_code == 302 and made["Location"] == f"/w/team-a/instances/{box.pk}/"
    dana = get_user_model().objects.get(username="dana")
    assert Collaborator.objects.get(instance=box, user=dana).access == "write"
    assert not Membership.objects.filter(workspace=world.team_a, user=dana).exists()
    assert stranger.get(f"/w/team-a/instances/{box.pk}/").status_code == 200
    for elsewhere in ("/w/team-a/", "/w/team-a/jobs/", "/w/team-a/instances/", "/w/team-a/members/"):
        assert stranger.get(elsewhere).status_code == 404, elsewhere
    # A second invitation (to erin), withdrawn before she uses it.
    bob.post(url, {"action": "invite", "email": "erin@example.org", "access": "read"})
    erins = link_in(mailbox, 2)
    invitation = Invitation.objects.get(email="erin@example.org")
    assert bob.post(url, {"action": "withdraw", "invitation": invitation.pk}).status_code == 302
    assert Client().get(erins).status_code == 410
    # Removed: her next request finds nothing.
    collaborator = Collaborator.objects.get(instance=box, user=dana)
    assert bob.post(url, {"action": "remove", "collaborator": collaborator.pk}).status_code == 302
    assert stranger.get(f"/w/team-a/instances/{box.pk}/").status_code == 404
    actions = list(AuditEvent.objects.filter(workspace=world.team_a).values_list("action", flat=True))
    for action in ("invitation.create", "invitation.accept", "collaborator.set", "invitation.withdraw"):
        assert action in actions, action
    assert actions.count("collaborator.remove") == 1


def test_an_invitation_to_an_ended_instance_no_longer_works(world: World, mailbox: Mailbox) -> None:
    from apps.compute.actions import check_launch_instance
    from apps.compute.models import Instance

    box = check_launch_instance(world.team_a, name="box", profile=world.cpu_small, acting_user=world.alice)
    signed_in(world.bob).post(
        f"/w/team-a/instances/{box.pk}/collaborators/",
        {"action": "invite", "email": "dana@example.org", "access": "read"},
    )
    link = link_in(mailbox)
    Instance.objects.filter(pk=box.pk).update(state=Instance.State.DELETED)
    page = Client().get(link)
    assert page.status_code == 410 and "has ended" in page.content.decode()
