"""A workspace's alerts page: its owners create, change, delete and silence its rules and silence
its alerts through the same form and actions as the console and the API (an owner's webhook to a
private address refused next to its field); members and viewers see the rules and alerts
read-only, without the webhook's URL; rules over every workspace and the platform kinds never show;
another tenant finds nothing, and changes nothing; bad input is a 400 naming the field."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.alerts.actions import do_save_rule
from apps.alerts.evaluate import evaluate
from apps.alerts.models import Alert, AlertRule
from apps.audit.models import AuditEvent
from apps.workspaces.models import Workspace
from tests.alerts.test_alerts import queued
from tests.personas import World
from tests.web.conftest import queries
from tests.web.test_pages import SignedIn

URL = "/w/team-a/alerts/"
NEW = "/w/team-a/alerts/rules/new/"
SECRET = "a-shared-secret-of-some-length"
HOOK = "https://hooks.example.org/team-a/token-in-path"
FORM = {"name": "queue", "kind": "queue_wait", "gpu_type": "", "threshold": "60", "for_s": "0", "enabled": "on"}


@pytest.fixture(autouse=True)
def _alert_settings(settings: Any) -> None:
    settings.PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS = False


def rule_of(world: World, workspace: Workspace | None, name: str = "queue", **fields: Any) -> AlertRule:
    body = {"kind": "queue_wait", "threshold": Decimal("60"), **fields}
    return do_save_rule(None, name=name, workspace=workspace, acting_user=world.admin, **body)


def alert_of(rule: AlertRule, key: str = "team-a", minutes_ago: int = 0) -> Alert:
    at = timezone.now() - timedelta(minutes=minutes_ago)
    return Alert.objects.create(
        rule=rule,
        key=key,
        workspace=rule.workspace,
        labels={"workspace": key},
        state=Alert.State.FIRING,
        pending_since=at,
        firing_since=at,
        last_seen_at=at,
    )


def main(response: Any) -> str:
    """The page's own content, without the top bar and the menu."""
    return response.content.decode().split('<main id="main"', 1)[1]


def field_errors(response: Any, field: str) -> str:
    found = re.search(rf'<div id="{field}-error">(.*?)</div>', response.content.decode(), re.S)
    return found.group(1) if found else ""


def state() -> list[tuple[Any, ...]]:
    """What a refused change must leave as it was: every rule and alert, and their audit trail."""
    rules = AlertRule.objects.order_by("pk").values_list(
        "pk", "name", "threshold", "enabled", "silenced_until", "webhook_url", "webhook_secret"
    )
    alerts = Alert.objects.order_by("pk").values_list("pk", "silenced_until")
    return [*rules, *alerts, (AuditEvent.objects.filter(action__startswith="alert").count(),)]


def test_an_owner_creates_changes_silences_and_deletes_a_rule(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    page = alice.get(URL)
    assert page.status_code == 200 and f'href="{NEW}"' in main(page)
    assert alice.get(NEW).status_code == 200
    body = {**FORM, "emails": "alice@example.org\nbob@example.org", "webhook_url": HOOK, "webhook_secret": SECRET}
    created = alice.post(NEW, body)
    assert created.status_code == 302 and created["Location"] == URL
    rule = AlertRule.objects.get()
    assert (rule.workspace, rule.kind, rule.threshold) == (world.team_a, "queue_wait", Decimal("60"))
    assert rule.emails == ["alice@example.org", "bob@example.org"] and rule.webhook_url == HOOK
    assert rule.webhook_secret == SECRET and rule.created_by == world.alice
    listed = alice.get(URL)
    assert f'data-rule="{rule.pk}"' in main(listed) and HOOK in main(listed) and SECRET not in listed.content.decode()
    edit = f"/w/team-a/alerts/rules/{rule.pk}/"
    form = alice.get(edit).content.decode()
    assert HOOK in form and SECRET not in form and "A webhook secret is set." in form
    changed = alice.post(edit, {**body, "threshold": "120.5", "webhook_secret": "", "enabled": ""})
    assert changed.status_code == 302
    rule.refresh_from_db()
    assert rule.threshold == Decimal("120.5") and not rule.enabled and rule.webhook_secret == SECRET  # kept
    assert alice.post(URL, {"action": "silence-rule", "rule": rule.pk, "for_s": "3600"}).status_code == 302
    rule.refresh_from_db()
    assert rule.silenced_until is not None and rule.silenced_until > timezone.now() + timedelta(minutes=59)
    assert alice.post(URL, {"action": "silence-rule", "rule": rule.pk, "for_s": "0"}).status_code == 302
    rule.refresh_from_db()
    assert rule.silenced_until is None
    assert alice.post(URL, {"action": "delete", "rule": rule.pk}).status_code == 302
    assert not AlertRule.objects.exists()
    events = AuditEvent.objects.filter(action__startswith="alertrule.").order_by("pk").values_list("action", "via")
    assert list(events) == [
        ("alertrule.create", "web"),
        ("alertrule.update", "web"),
        ("alertrule.silence", "web"),
        ("alertrule.silence", "web"),
        ("alertrule.delete", "web"),
    ]


def test_an_owner_silences_an_alert_the_rule_raised(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    assert alice.post(NEW, {**FORM, "threshold": "30"}).status_code == 302
    queued(world, age_s=100)
    evaluate()
    alert = Alert.objects.get()
    page = main(alice.get(URL))
    assert f'data-alert="{alert.pk}"' in page and 'name="action" value="silence-alert"' in page
    assert alice.post(URL, {"action": "silence-alert", "alert": alert.pk, "for_s": "86400"}).status_code == 302
    alert.refresh_from_db()
    assert alert.silenced_until is not None and alert.silenced_until > timezone.now() + timedelta(hours=23)
    assert "Silenced" in main(alice.get(URL))
    event = AuditEvent.objects.get(action="alert.silence")
    assert (event.actor, event.via) == (world.alice, "web")


def test_members_and_viewers_see_the_rules_and_alerts_read_only(world: World, signed_in: SignedIn) -> None:
    rule = rule_of(world, world.team_a, webhook_url=HOOK, webhook_secret=SECRET, emails=["ops@example.org"])
    alert = alert_of(rule)
    before = state()
    for user in (world.bob, world.victor):  # a member (through the group) and a viewer
        client = signed_in(user)
        page = client.get(URL)
        assert page.status_code == 200, user
        text = main(page)
        assert f'data-rule="{rule.pk}"' in text and f'data-alert="{alert.pk}"' in text and "ops@example.org" in text
        assert HOOK not in page.content.decode() and SECRET not in page.content.decode(), user
        assert "<form" not in text and "/alerts/rules/" not in text, user  # nothing to change with, no form to open
        assert '<a href="/w/team-a/alerts/" aria-current="page">Alerts</a>' in page.content.decode()
        for url in (NEW, f"/w/team-a/alerts/rules/{rule.pk}/"):
            assert client.get(url).status_code == 403, (user, url)
            assert client.post(url, {**FORM, "name": "changed"}).status_code == 403, (user, url)
        for body in (
            {"action": "delete", "rule": rule.pk},
            {"action": "silence-rule", "rule": rule.pk, "for_s": "3600"},
            {"action": "silence-alert", "alert": alert.pk, "for_s": "3600"},
        ):
            assert client.post(URL, body).status_code == 403, (user, body)
        assert state() == before, user
    assert HOOK in main(signed_in(world.alice).get(URL))  # the owners' to see


def test_another_tenant_finds_nothing_and_changes_nothing(world: World, signed_in: SignedIn) -> None:
    rule = rule_of(world, world.team_a)
    alert = alert_of(rule)
    theirs = rule_of(world, world.team_b, name="theirs")
    their_alert = alert_of(theirs, key="team-b")
    before = state()
    charlie = signed_in(world.charlie)
    edit = f"/w/team-a/alerts/rules/{rule.pk}/"
    for url in (URL, NEW, edit):
        assert charlie.get(url).status_code == 404, url
        assert charlie.post(url, {**FORM, "name": "changed"}).status_code == 404, url
    actions = (
        {"action": "delete", "rule": rule.pk},
        {"action": "silence-rule", "rule": rule.pk, "for_s": "3600"},
        {"action": "silence-alert", "alert": alert.pk, "for_s": "3600"},
    )
    for body in actions:
        assert charlie.post(URL, body).status_code == 404, body
    # Nor does an owner reach another workspace's rule or alert through their own workspace's page.
    alice = signed_in(world.alice)
    assert alice.get(f"/w/team-a/alerts/rules/{theirs.pk}/").status_code == 404
    assert alice.post(f"/w/team-a/alerts/rules/{theirs.pk}/", {**FORM, "name": "changed"}).status_code == 404
    for body in (
        {"action": "delete", "rule": theirs.pk},
        {"action": "silence-rule", "rule": theirs.pk},
        {"action": "silence-alert", "alert": their_alert.pk},
    ):
        assert alice.post(URL, body).status_code == 404, body
    assert "theirs" not in main(alice.get(URL))
    assert state() == before


def test_an_owners_webhook_to_loopback_is_refused_next_to_the_field(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    for url in ("http://127.0.0.1:8000/hook", "http://localhost/x", "http://169.254.169.254/latest"):
        refused = alice.post(NEW, {**FORM, "webhook_url": url, "webhook_secret": SECRET})
        assert refused.status_code == 400, url
        assert "A webhook may not point at" in field_errors(refused, "webhook_url"), url
        assert f'value="{url}"' in refused.content.decode()  # the form keeps what was typed
    assert not AlertRule.objects.exists()
    rule = rule_of(world, world.team_a, webhook_url=HOOK, webhook_secret=SECRET)
    moved = alice.post(f"/w/team-a/alerts/rules/{rule.pk}/", {**FORM, "webhook_url": "http://127.0.0.1:9/"})
    assert moved.status_code == 400 and "loopback" in field_errors(moved, "webhook_url")
    rule.refresh_from_db()
    assert rule.webhook_url == HOOK


def test_rules_over_every_workspace_and_platform_kinds_never_show(world: World, signed_in: SignedIn) -> None:
    everywhere = rule_of(world, None, name="every-queue")
    nodes = rule_of(world, None, name="nodes-down", kind="node_unhealthy", threshold=Decimal("0"))
    alert_of(everywhere)  # about team-a, raised by a rule over every workspace
    alert_of(nodes, key="node-1")
    # A platform kind tied to the workspace, as the actions never make one: still the console's.
    stray = AlertRule.objects.create(name="stray-nodes", kind="node_unhealthy", workspace=world.team_a)
    alert_of(stray, key="node-2")
    own = rule_of(world, world.team_a, name="own-queue")
    alert_of(own)
    before = state()
    alice = signed_in(world.alice)
    page = main(alice.get(URL))
    assert "own-queue" in page and "every-queue" not in page and "nodes-down" not in page and "stray" not in page
    assert page.count("data-alert=") == 1
    for rule in (everywhere, nodes, stray):
        assert alice.get(f"/w/team-a/alerts/rules/{rule.pk}/").status_code == 404
        assert alice.post(URL, {"action": "silence-rule", "rule": rule.pk}).status_code == 404
        assert alice.post(URL, {"action": "silence-alert", "alert": rule.alerts.get().pk}).status_code == 404
    form = alice.get(NEW).content.decode()
    assert 'value="gpu_idle"' in form and 'value="node_unhealthy"' not in form and 'value="backend_failing"' not in form
    # Nor may a platform admin make one of the platform kinds on a workspace's page.
    for user in (world.alice, world.admin):
        refused = signed_in(user).post(NEW, {**FORM, "kind": "node_unhealthy"})
        assert refused.status_code == 400 and field_errors(refused, "kind"), user
    assert state() == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"threshold": "-1"}, "threshold"),
        ({"threshold": "lots"}, "threshold"),
        ({"threshold": "150", "kind": "gpu_idle"}, "threshold"),
        ({"kind": "gpu_util"}, "kind"),
        ({"emails": "ops@example.org\nnot an address"}, "emails"),
        ({"webhook_url": "ftp://example.org/x", "webhook_secret": SECRET}, "webhook_url"),
        ({"webhook_url": "https://example.org/x"}, "webhook_secret"),
        ({"webhook_url": "https://example.org/x", "webhook_secret": "short"}, "webhook_secret"),
        ({"for_s": "-5"}, "for_s"),
        ({"for_s": "99999999999999999999"}, "for_s"),
        ({"gpu_type": "H 100"}, "gpu_type"),
        ({"name": "  "}, "name"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    world: World, signed_in: SignedIn, body: dict[str, str], field: str
) -> None:
    refused = signed_in(world.alice).post(NEW, {**FORM, **body})
    assert refused.status_code == 400
    assert field_errors(refused, field), refused.content.decode()[-3000:]
    assert not AlertRule.objects.exists()


def test_a_bad_silence_or_change_is_a_400_and_changes_nothing(world: World, signed_in: SignedIn) -> None:
    rule = rule_of(world, world.team_a)
    alert = alert_of(rule)
    before = state()
    alice = signed_in(world.alice)
    for body in (
        {"action": "silence-rule", "rule": rule.pk, "for_s": "forever"},
        {"action": "silence-rule", "rule": rule.pk, "for_s": "99999999999999"},
        {"action": "silence-alert", "alert": alert.pk, "for_s": "-60"},
        {"action": "rename", "rule": rule.pk},
        {},
    ):
        refused = alice.post(URL, body)
        assert refused.status_code == 400, body
        assert '<div class="form-error" role="alert">' in refused.content.decode(), body
    for body in (
        {"action": "delete", "rule": "abc"},
        {"action": "delete", "rule": "9" * 30},
        {"action": "silence-alert", "alert": "²"},
    ):
        assert alice.post(URL, body).status_code == 404, body
    assert alice.get("/w/team-a/alerts/rules/99999999999999999999/").status_code == 404
    assert state() == before


def test_the_alerts_are_listed_newest_first_a_page_at_a_time(world: World, signed_in: SignedIn) -> None:
    rule = rule_of(world, world.team_a)
    old, new = alert_of(rule, key="old", minutes_ago=90), alert_of(rule, key="new", minutes_ago=5)
    alice = signed_in(world.alice)
    page = main(alice.get(URL))
    assert page.index(f'data-alert="{new.pk}"') < page.index(f'data-alert="{old.pk}"')
    few = queries(alice, URL)
    other = rule_of(world, world.team_a, name="quota", kind="quota_used", threshold=Decimal("90"))
    for n in range(60):
        alert_of(other, key=f"team-a/h100/{n}", minutes_ago=200 + n)
    assert queries(alice, URL) == few
    assert queries(signed_in(world.bob), URL) <= few
    first = main(alice.get(URL))
    assert first.count("data-alert=") == 50 and "Page 1 of 2" in first and f'data-alert="{new.pk}"' in first
    second = main(alice.get(URL + "?page=2"))
    assert second.count("data-alert=") == 12 and "team-a/h100/59" in second and f'data-alert="{new.pk}"' not in second


def test_the_menu_links_the_page_for_everyone_who_sees_the_workspace(world: World, signed_in: SignedIn) -> None:
    for user in (world.alice, world.bob, world.victor):
        page = signed_in(user).get("/w/team-a/").content.decode()
        assert '<a href="/w/team-a/alerts/" >Alerts</a>' in page, user
