"""Alert rules: evaluation, deduplication, resolution, silencing, delivery by mail (a real SMTP
server) and by signed webhook (a real HTTP receiver on loopback), and who may see and change what."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.test import Client
from django.utils import timezone

from apps.alerts.actions import do_save_rule
from apps.alerts.delivery import payload
from apps.alerts.evaluate import evaluate
from apps.alerts.models import Alert, AlertRule
from apps.audit.actions import do_log_event
from apps.audit.events import Event
from apps.audit.models import AuditEvent
from apps.inventory.models import Node
from apps.jobs.models import Job
from tests.api.endpoints import job
from tests.mail import Mailbox, body_of, smtp_server
from tests.personas import World

SECRET = "a-shared-secret-of-some-length"


@dataclass
class Receiver:
    """A webhook receiver on loopback that keeps each POST and answers with the next status."""

    statuses: list[int] = field(default_factory=list)
    received: list[tuple[Any, bytes]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.received.append((self.headers, body))
            self.send_response(got.statuses.pop(0) if got.statuses else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    got.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def mailbox(settings: Any) -> Iterator[Mailbox]:
    with smtp_server() as box:
        for name, value in box.settings().items():
            setattr(settings, name, value)
        yield box


@pytest.fixture(autouse=True)
def _alert_settings(settings: Any) -> None:
    settings.PORTAL_ALERTS_REPEAT_S = 0
    settings.PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS = False


def verify(headers: Any, body: bytes, secret: str = SECRET) -> dict[str, Any]:
    """What a receiver does: recompute the signature over "<timestamp>.<body>", compare in
    constant time, refuse a stale timestamp."""
    timestamp = headers["X-GPUPortal-Timestamp"]
    expected = "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(expected, headers["X-GPUPortal-Signature"])
    assert abs(timezone.now().timestamp() - int(timestamp)) < 300
    answer = json.loads(body)
    assert isinstance(answer, dict)
    return answer


def queued(world: World, age_s: float = 0) -> Job:
    made = job(world, world.team_a)
    Job.objects.filter(pk=made.pk).update(state=Job.State.QUEUED, created_at=timezone.now() - timedelta(seconds=age_s))
    return made


def create_rule(world: World, user: Any, **body: Any) -> Any:
    body = {"workspace": "team-a", "name": "queue", "kind": "queue_wait", "threshold": "60.00", **body}
    return world.client(user).post("/api/v1/alert-rules/", body, format="json")


def at(seconds: float) -> datetime:
    return timezone.now() + timedelta(seconds=seconds)


def test_a_rule_fires_after_for_s_once_then_resolves(
    world: World, mailbox: Mailbox, receiver: Receiver, settings: Any
) -> None:
    settings.PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS = True  # the receiver is on loopback
    response = create_rule(world, world.alice, for_s=120, emails=["bob@example.org"], webhook_url=receiver.url,
                           webhook_secret=SECRET)  # fmt: skip
    assert response.status_code == 201, response.json()
    assert response.json()["webhook_secret_set"] is True and "webhook_secret" not in response.json()
    work = queued(world, age_s=100)

    evaluate(now=at(0))  # waited 100 s > 60: pending
    [alert] = Alert.objects.all()
    assert alert.state == "pending" and alert.value is not None and alert.value >= 100
    evaluate(now=at(60))
    assert Alert.objects.get().state == "pending" and not receiver.received and not mailbox.received
    evaluate(now=at(130))  # held for 130 s >= 120: firing, told once
    assert Alert.objects.get().state == "firing"
    [mail] = mailbox.wait_for(1)
    assert mail["Subject"].startswith('[FIRING] Alert rule "queue"') and "workspace: team-a" in body_of(mail)
    assert mail["To"] == "bob@example.org" and mail.get_content_type() == "text/plain"
    [(headers, body)] = receiver.received
    sent = verify(headers, body)
    assert sent["status"] == "firing" and sent["labels"]["workspace"] == "team-a"
    assert sent["rule"]["name"] == "queue" and sent["threshold"] == "60.00" and sent["resolved_at"] is None
    assert sent["alert"] == alert.pk and sent["api_url"].endswith(f"/api/v1/alerts/{alert.pk}/")
    # The rule names no GPU type: the label is left out, not sent empty.
    assert sent["labels"] == {"workspace": "team-a"} and Alert.objects.get().labels == {"workspace": "team-a"}
    # A person is sent to the workspace's alerts page, where the alert is listed; never to the JSON.
    page = urlsplit(sent["url"])
    assert page.path == "/w/team-a/alerts/" and sent["url"] in body_of(mail).splitlines()
    assert "/api/" not in body_of(mail)
    bob = Client()
    bob.force_login(world.bob)
    listed = bob.get(page.path)
    assert listed.status_code == 200 and "queue" in listed.content.decode()

    evaluate(now=at(200))
    evaluate(now=at(400))  # still firing: nothing more
    assert len(mailbox.received) == 1 and len(receiver.received) == 1

    Job.objects.filter(pk=work.pk).update(state=Job.State.CANCELLED)
    evaluate(now=at(500))
    alert = Alert.objects.get()
    assert alert.state == "resolved" and alert.resolved_at is not None
    mails = mailbox.wait_for(2)
    assert mails[1]["Subject"].startswith('[RESOLVED] Alert rule "queue"')
    sent = verify(*receiver.received[1])
    assert sent["status"] == "resolved" and sent["resolved_at"]
    evaluate(now=at(600))
    assert len(mailbox.received) == 2 and len(receiver.received) == 2
    actions = set(AuditEvent.objects.filter(target_type="alerts.alert").values_list("action", flat=True))
    assert actions == {"alert.fire", "alert.resolve"}


def test_a_silenced_alert_is_listed_but_not_sent(world: World, mailbox: Mailbox) -> None:
    rule = create_rule(world, world.alice, emails=["bob@example.org"]).json()
    queued(world, age_s=100)
    evaluate()
    [alert] = Alert.objects.all()
    assert alert.state == "firing"  # for_s 0: at once
    mailbox.wait_for(1)
    alice = world.client(world.alice)
    # A rule silenced: nothing of a new episode goes out.
    assert alice.post(f"/api/v1/alert-rules/{rule['id']}/silence/", {"for_s": 3600}, format="json").status_code == 200
    Alert.objects.all().delete()
    evaluate()
    assert Alert.objects.get().state == "firing" and len(mailbox.received) == 1
    listed = alice.get("/api/v1/alerts/").json()["results"]
    assert [a["silenced"] for a in listed] == [True]
    # The rule's silence lifted, the alert's own silence holds.
    alert = Alert.objects.get()
    assert alice.post(f"/api/v1/alert-rules/{rule['id']}/silence/", {"for_s": 0}, format="json").status_code == 200
    answer = alice.post(f"/api/v1/alerts/{alert.pk}/silence/", {"until": at(3600).isoformat()}, format="json")
    assert answer.status_code == 200, answer.json()
    assert answer.json()["silenced"] is True
    evaluate()
    assert len(mailbox.received) == 1
    # Once it ends, it goes out.
    evaluate(now=at(3700))
    assert len(mailbox.wait_for(2)) == 2
    assert AuditEvent.objects.filter(action__in=["alert.silence", "alertrule.silence"]).count() == 3


def test_a_failing_webhook_is_recorded_and_tried_again(
    world: World, mailbox: Mailbox, receiver: Receiver, settings: Any
) -> None:
    settings.PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS = True
    receiver.statuses = [500]
    create_rule(world, world.alice, emails=["bob@example.org"], webhook_url=receiver.url, webhook_secret=SECRET)
    queued(world, age_s=100)
    evaluate()
    alert = Alert.objects.get()
    assert alert.last_delivery["webhook"]["ok"] is False
    assert alert.delivery_error == "webhook: delivery failed: HTTP error"  # not what the target answered
    assert alert.last_delivery["email"]["ok"] is True and "webhook" not in alert.delivered
    shown = world.client(world.alice).get(f"/api/v1/alerts/{alert.pk}/").json()
    assert shown["delivery_error"] == "webhook: delivery failed: HTTP error"
    evaluate()  # tried again: the webhook only
    alert.refresh_from_db()
    assert alert.delivered == {"email": "firing", "webhook": "firing"} and alert.delivery_error == ""
    assert len(receiver.received) == 2 and len(mailbox.received) == 1
    verify(*receiver.received[1])


def test_an_unreachable_webhook_does_not_stop_the_evaluation(world: World, settings: Any) -> None:
    settings.PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS = True
    create_rule(world, world.alice, webhook_url="http://127.0.0.1:9/hook", webhook_secret=SECRET)
    queued(world, age_s=100)
    counts = evaluate()
    assert counts["alerts_firing"] == 1 and counts["alerts_delivery_failed"] == 1
    assert Alert.objects.get().last_delivery["webhook"]["error"]


def test_a_reminder_goes_out_after_the_repeat_interval(world: World, mailbox: Mailbox, settings: Any) -> None:
    settings.PORTAL_ALERTS_REPEAT_S = 3600
    create_rule(world, world.alice, emails=["bob@example.org"])
    queued(world, age_s=100)
    evaluate()
    evaluate(now=at(1800))
    assert len(mailbox.wait_for(1)) == 1
    evaluate(now=at(3700))
    assert len(mailbox.wait_for(2)) == 2


def test_quota_nodes_and_failures(world: World) -> None:
    quota = do_save_rule(None, name="quota", kind="quota_used", workspace=world.team_a, gpu_type="h100",
                         threshold=Decimal("50"), acting_user=world.alice)  # fmt: skip
    nodes = do_save_rule(None, name="nodes", kind="node_unhealthy", threshold=Decimal("0"), acting_user=world.admin)
    failing = do_save_rule(None, name="failing", kind="backend_failing", threshold=Decimal("2"), window_s=600,
                           acting_user=world.admin)  # fmt: skip
    evaluate()
    assert not Alert.objects.exists()  # nothing allocated, every node ready, no failure
    Node.objects.update(state="down")
    made = job(world, world.team_a)
    for _ in range(2):
        do_log_event(Event.JOB_FAILED, made, workspace=world.team_a)
    evaluate()
    assert Alert.objects.get(rule=nodes).labels["state"] == "down"
    assert Alert.objects.get(rule=failing).value == 2
    assert not Alert.objects.filter(rule=quota).exists()
    # Global rules' alerts are for admins only.
    assert world.client(world.alice).get("/api/v1/alerts/").json()["count"] == 0
    assert world.client(world.admin).get("/api/v1/alerts/").json()["count"] == 2


def test_quota_used_counts_allocations(world: World, django_capture_on_commit_callbacks: Any) -> None:
    do_save_rule(None, name="quota", kind="quota_used", workspace=world.team_a, threshold=Decimal("25"),
                 acting_user=world.alice)  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        response = world.client(world.alice).post(
            "/api/v1/instances/", {"workspace": "team-a", "name": "box", "profile": "gpu-1"}, format="json"
        )
    assert response.status_code == 201, response.json()
    evaluate()
    [alert] = Alert.objects.all()
    assert alert.labels == {"workspace": "team-a", "gpu_type": "h100", "gpus_allocated": "1", "quota_gpus": "4"}
    assert alert.value == Decimal("25.00")


def test_owners_admins_and_other_tenants(world: World) -> None:
    created = create_rule(world, world.alice, webhook_url="https://hooks.example.org/x", webhook_secret=SECRET)
    assert created.status_code == 201, created.json()
    rule = created.json()
    assert rule["webhook_url"] == "https://hooks.example.org/x" and rule["webhook_secret_set"] is True
    # A viewer and a member see it, without the webhook URL; neither may change it.
    for user in (world.victor, world.bob):
        seen = world.client(user).get(f"/api/v1/alert-rules/{rule['id']}/").json()
        assert seen["webhook_url"] == "" and "webhook_secret" not in seen
        assert world.client(user).patch(f"/api/v1/alert-rules/{rule['id']}/", {"enabled": False},
                                        format="json").status_code == 403  # fmt: skip
    assert create_rule(world, world.bob).status_code == 403
    # Another tenant neither sees nor creates.
    charlie = world.client(world.charlie)
    assert charlie.get(f"/api/v1/alert-rules/{rule['id']}/").status_code == 404
    assert charlie.get("/api/v1/alert-rules/").json()["count"] == 0
    refused = create_rule(world, world.charlie)
    assert refused.status_code == 400 and "workspace" in refused.json()["error"]["fields"]
    # Owners have workspace rules only; admins have rules over every workspace, and the platform kinds.
    for body in ({"workspace": None}, {"workspace": None, "kind": "node_unhealthy"}):
        assert create_rule(world, world.alice, **body).status_code == 403
    for kind in ("node_unhealthy", "backend_failing"):
        answer = create_rule(world, world.alice, kind=kind)
        assert answer.status_code == 400, answer.json()
        assert answer.json()["error"]["field_codes"] == {"kind": ["rule"]}
    admin_rule = create_rule(world, world.admin, workspace=None, kind="node_unhealthy", name="nodes")
    assert admin_rule.status_code == 201, admin_rule.json()
    assert world.client(world.alice).get(f"/api/v1/alert-rules/{admin_rule.json()['id']}/").status_code == 404
    assert world.client(world.admin).get("/api/v1/alert-rules/").json()["count"] == 2
    assert AuditEvent.objects.filter(action="alertrule.create").count() == 2


def test_an_owners_webhook_may_not_reach_private_addresses(world: World, settings: Any) -> None:
    for url in (
        "http://127.0.0.1:8000/hook",
        "http://localhost/x",
        "http://169.254.169.254/latest",
        "http://[::1]/",
        "http://10.0.0.8/",
        "http://192.168.1.1/",
    ):
        answer = create_rule(world, world.alice, webhook_url=url, webhook_secret=SECRET)
        assert answer.status_code == 400, url
        assert answer.json()["error"]["field_codes"] == {"webhook_url": ["rule"]}
    # An admin's may, and so may an owner's with the setting on.
    loopback = {"webhook_url": "http://127.0.0.1:8000/hook", "webhook_secret": SECRET}
    assert create_rule(world, world.admin, **loopback).status_code == 201
    settings.PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS = True
    assert create_rule(world, world.alice, **loopback).status_code == 201


def test_delivery_refuses_a_name_that_resolves_to_a_private_address(world: World) -> None:
    rule = AlertRule.objects.create(name="r", kind="queue_wait", workspace=world.team_a, threshold=Decimal("1"),
                                    webhook_url="http://localhost:9/hook", webhook_secret=SECRET)  # fmt: skip
    queued(world, age_s=100)
    evaluate(rules=[rule])
    assert Alert.objects.get().last_delivery["webhook"]["error"] == "delivery failed: refused address"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"threshold": "-1"}, "threshold"),
        ({"kind": "gpu_util"}, "kind"),
        ({"emails": ["not an address"]}, "emails"),
        ({"webhook_url": "ftp://example.org/x", "webhook_secret": SECRET}, "webhook_url"),
        ({"webhook_url": "https://example.org/x"}, "webhook_secret"),
        ({"webhook_url": "https://example.org/x", "webhook_secret": "short"}, "webhook_secret"),
        ({"for_s": -5}, "for_s"),
        ({"gpu_type": "H 100"}, "gpu_type"),
        ({"threshold": 60}, "threshold"),
        ({"name": "  "}, "name"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(world: World, body: dict[str, Any], field: str) -> None:
    answer = create_rule(world, world.alice, **body)
    assert answer.status_code == 400, answer.json()
    assert field in answer.json()["error"]["fields"], answer.json()
    assert not AlertRule.objects.exists()


def test_silence_input(world: World) -> None:
    rule = create_rule(world, world.alice).json()
    url = f"/api/v1/alert-rules/{rule['id']}/silence/"
    alice = world.client(world.alice)
    for body in ({"until": "yesterday"}, {"until": "2001-01-01T00:00:00Z"}, {"until": at(60).isoformat(), "for_s": 5}):
        assert alice.post(url, body, format="json").status_code == 400, body
    answer = alice.post(url, format="json")
    assert answer.status_code == 200 and answer.json()["silenced_until"]


def test_the_console_page(world: World) -> None:
    from django.test import Client

    admin = Client()
    admin.force_login(world.admin)
    response = admin.post("/console/alerts/rules/new/", {"name": "waits", "kind": "queue_wait", "workspace": "team-a",
                                                          "threshold": "60", "for_s": "0", "emails": "ops@example.org",
                                                          "enabled": "on"})  # fmt: skip
    assert response.status_code == 302, response.content[:2000]
    rule = AlertRule.objects.get()
    assert rule.emails == ["ops@example.org"] and rule.workspace == world.team_a and rule.enabled
    queued(world, age_s=100)
    evaluate()
    alert = Alert.objects.get()
    page = admin.get("/console/alerts/")
    assert page.status_code == 200 and b"waits" in page.content and b"Silence" in page.content
    assert admin.post(f"/console/alerts/{alert.pk}/silence/", {"for_s": "3600"}).status_code == 302
    alert.refresh_from_db()
    assert alert.silenced_until is not None
    assert admin.post(f"/console/alerts/rules/{rule.pk}/silence/", {"for_s": "600"}).status_code == 302
    rule.refresh_from_db()
    assert rule.silenced_until is not None
    assert admin.post(f"/console/alerts/rules/{rule.pk}/silence/", {"for_s": "0"}).status_code == 302
    rule.refresh_from_db()
    assert rule.silenced_until is None
    bad = admin.post(f"/console/alerts/rules/{rule.pk}/", {"name": "waits", "kind": "queue_wait",
                                                            "threshold": "-3", "workspace": "team-a"})  # fmt: skip
    assert bad.status_code == 400
    assert admin.post(f"/console/alerts/rules/{rule.pk}/delete/").status_code == 302
    assert not AlertRule.objects.exists()
    alice = Client()
    alice.force_login(world.alice)
    assert alice.get("/console/alerts/").status_code == 403


def test_gpus_held_idle_fire_where_measured_and_never_for_want_of_figures(world: World, mailbox: Mailbox) -> None:
    from apps.inventory.models import GPU
    from apps.telemetry.models import GpuSample

    made = create_rule(world, world.alice, name="idle", kind="gpu_idle", threshold="10.00", for_s=0,
                       emails=["alice@example.org"])  # fmt: skip
    assert made.status_code == 201, made.json()
    assert create_rule(world, world.alice, name="bad", kind="gpu_idle", threshold="150.00").status_code == 400
    evaluate()
    assert not Alert.objects.exists()  # no telemetry: nothing measured, nothing found

    gpus = list(GPU.objects.order_by("index")[:2])

    def measured(*utilisations: float, workspace: Any = world.team_a) -> None:
        now = timezone.now()
        for gpu, utilisation in zip(gpus, utilisations, strict=False):
            GpuSample.objects.create(gpu=gpu, at=now, resolution_s=0, utilisation=utilisation, memory_used_mb=1,
                                     memory_total_mb=2, workspace=workspace)  # fmt: skip

    measured(3.0, 9.0)  # team-a's two GPUs, 6 % on average
    measured(0.0, workspace=world.team_b)  # another workspace's: not this rule's
    evaluate()
    [alert] = Alert.objects.all()
    assert alert.state == Alert.State.FIRING and alert.labels["workspace"] == "team-a" and alert.value == Decimal(6)
    assert alert.labels["gpus_measured"] == "2"
    [mail] = mailbox.wait_for(1)
    assert "idle" in mail["Subject"]
    measured(60.0, 60.0)  # busy again (the newest sample of each GPU counts)
    evaluate()
    alert.refresh_from_db()
    assert alert.state == Alert.State.RESOLVED


def test_an_empty_label_stored_before_is_left_out_of_the_webhook(world: World) -> None:
    """An alert evaluated before labels that do not apply were left out may hold one empty."""
    rule = do_save_rule(None, name="queue", kind="queue_wait", workspace=world.team_a, threshold=Decimal(60),
                        acting_user=world.alice)  # fmt: skip
    now = timezone.now()
    alert = Alert.objects.create(rule=rule, key="workspace=team-a", workspace=world.team_a,
                                 labels={"workspace": "team-a", "gpu_type": ""}, pending_since=now,
                                 last_seen_at=now)  # fmt: skip
    sent = payload(alert, "firing")
    assert sent["labels"] == {"workspace": "team-a"}
    assert urlsplit(sent["url"]).path == "/w/team-a/alerts/"
    assert urlsplit(sent["api_url"]).path == f"/api/v1/alerts/{alert.pk}/"
