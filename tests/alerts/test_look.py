"""The alerts pages in a real browser (tests/look.py), at a desktop's and a phone's width: a
workspace's as its owner and a member see it, its rule form, and the console's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.alerts.evaluate import evaluate
from apps.alerts.models import Alert, AlertRule
from apps.jobs.models import Job
from tests.api.endpoints import job
from tests.look import look_at
from tests.personas import make_world

pytestmark = pytest.mark.slow


def test_the_alerts_pages_look_right_at_both_widths(transactional_db: None, live_server: Any, settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    world = make_world()
    alice = world.client(world.alice)
    for name, kind, threshold in (("Queue waits over a minute", "queue_wait", "60.00"),
                                  ("Quota nearly used up", "quota_used", "90.00")):  # fmt: skip
        body = {"workspace": "team-a", "name": name, "kind": kind, "threshold": threshold,
                "emails": ["bob@example.org", "alice@example.org"], "for_s": 300}  # fmt: skip
        assert alice.post("/api/v1/alert-rules/", body, format="json").status_code == 201
    waiting = job(world, world.team_a)
    Job.objects.filter(pk=waiting.pk).update(state=Job.State.QUEUED, created_at=timezone.now() - timedelta(hours=1))
    evaluate(now=timezone.now() - timedelta(minutes=10))
    evaluate()
    assert Alert.objects.filter(state="firing").exists()
    rule = AlertRule.objects.get(name="Queue waits over a minute")

    seen = look_at(
        live_server.url,
        [
            (world.alice, "/w/team-a/alerts/", "workspace-alerts-owner"),
            (world.bob, "/w/team-a/alerts/", "workspace-alerts-member"),
            (world.alice, f"/w/team-a/alerts/rules/{rule.pk}/", "workspace-alert-rule"),
            (world.admin, "/console/alerts/", "console-alerts"),
        ],
    )
    for (name, width), (status, styled, fits, stacked) in seen.items():
        assert status == 200, name
        assert styled, f"{name}: the stylesheet is not applied"
        assert fits, f"{name} scrolls sideways at {width} px"
        assert stacked == (None if name == "workspace-alert-rule" else width == "390"), f"{name} at {width} px"
    assert len(seen) == 8
