"""The inference endpoint pages in a real browser against the live portal (see conftest.py), at a
desktop's and a phone's width: the workspace's list, an endpoint's page with its charts drawn from
an hour of figures, a failed one with its server's words, and the new-endpoint form; styled, fitting
the width, tables stacked on the phone, nothing the page's policy refuses; and a change made in
another process (a member scales the endpoint) reaches the open page without a reload.

Rows are made directly, as the autoscaler and the host leave them: no server runs and none is
started (a serving replica without a backend is left alone by the host, and the one waiting is
not eligible for an hour)."""

from __future__ import annotations

import json
import math
import re
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from apps.catalog.models import InferenceProfile
from apps.inference.actions import do_update_endpoint
from apps.inference.models import Endpoint, Replica, Sample, ScaleEvent
from tests.browser.conftest import Portal, off_the_loop, sign_in
from tests.browser.test_rayclusters import LIVE_S, at_both_widths, watch
from tests.personas import PASSWORD, World, make_world

pytestmark = pytest.mark.slow
State = Endpoint.State
WHY = (
    "replica broken-1 did not start: its server exited with 1; its last lines:\n"
    "llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' has wrong shape\n"
    "llama_load_model_from_file: failed to load model\n"
    "ValueError: Failed to load model from file: /work/team-a/models/broken.gguf"
)


@pytest.fixture
def people(portal: Portal) -> World:
    return make_world()


def _replica(endpoint: Endpoint, serial: int, **fields: Any) -> Replica:
    values = {"version": 1, "baseline": True, "cpu_cores": 2, "memory_gb": 4, "created_by": endpoint.created_by}
    return Replica.objects.create(
        workspace=endpoint.workspace, name=f"{endpoint.name}-{serial}", endpoint=endpoint, **{**values, **fields}
    )


def _figures(endpoint: Endpoint) -> None:
    """An hour of samples every 10 s: a morning's traffic that rose, needed a third replica, and calmed."""
    now = timezone.now()
    rows = []
    for i in range(360):
        at = now - timedelta(seconds=10 * (360 - i)) - timedelta(seconds=15)
        wave = max(0.0, math.sin(i / 60))
        rate = round(1.5 + 6 * wave + (i % 7) / 10, 2)
        replicas = 3 if 90 < i < 250 else 2
        rows.append(Sample(
            endpoint=endpoint, at=at, replicas=replicas, serving=2 if 90 < i < 97 else replicas,
            waiting=int(wave * 4), requests_per_s=rate, errors_per_s=0.2 if 150 < i < 160 else 0.0,
            p50_s=0.18 + 0.1 * wave, p95_s=0.45 + 0.6 * wave, tokens_per_s=round(rate * 42, 1),
        ))  # fmt: skip
    Sample.objects.bulk_create(rows)


def endpoints(world: World) -> dict[str, Endpoint]:
    profile = InferenceProfile.objects.create(
        name="llama-cpu", display_name="llama.cpp, 2 CPU", server=InferenceProfile.Server.LLAMACPP, cpu_cores=2,
        memory_gb=4, concurrency=4, scale_up_after_s=5, scale_down_after_s=3600, published=True,
    )  # fmt: skip
    now = timezone.now()
    common = {"workspace": world.team_a, "profile": profile, "created_by": world.alice, "source": "path"}
    chat = Endpoint.objects.create(
        name="chat", state=State.READY, model_path="models/tinyllama-q4.gguf", min_replicas=2, max_replicas=4,
        desired_replicas=3, last_request_at=now, description="The team's chat assistant", **common,
    )  # fmt: skip
    for serial in (1, 2):
        _replica(chat, serial, state=Replica.State.READY, started_at=now - timedelta(minutes=50), admitted_at=now)
    _replica(chat, 3, baseline=False, state=Replica.State.QUEUED, eligible_at=now + timedelta(hours=1),
             wait_reason="waiting for quota: 254 of 256 CPU cores in use")  # fmt: skip
    ScaleEvent.objects.create(endpoint=chat, from_replicas=0, to_replicas=2, reason="deployed with 2 replicas")
    ScaleEvent.objects.create(endpoint=chat, from_replicas=2, to_replicas=3,
                              reason="14 requests in flight or waiting (6 waiting) for 20 s")  # fmt: skip
    _figures(chat)
    broken = Endpoint.objects.create(
        name="broken", state=State.FAILED, model_path="models/broken.gguf", failure_reason=WHY, finished_at=now,
        **common,
    )  # fmt: skip
    _replica(broken, 1, state=Replica.State.FAILED, finished_at=now, reason="its server exited with 1")
    ScaleEvent.objects.create(endpoint=broken, from_replicas=0, to_replicas=1, reason="deployed with 1 replica")
    return {"chat": chat, "broken": broken}


def test_the_endpoint_pages_at_desktop_and_phone_widths(page: Page, portal: Portal, people: World) -> None:
    rows = endpoints(people)
    problems: list[str] = []
    watch(page, problems)
    sign_in(page, portal.url, "alice", PASSWORD)
    page.goto(f"{portal.url}/w/team-a/")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Endpoints", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Inference endpoints")
    row = page.locator('[data-endpoint="chat"]')
    expect(row).to_contain_text("2 serving / 3 wanted")
    expect(row).to_contain_text("between 2 and 4")
    at_both_widths(page, "endpoint-list")

    page.get_by_role("link", name="chat", exact=True).click()
    expect(page.locator("#endpoint-state [data-state]")).to_have_text("Ready")
    expect(page.locator("#endpoint-replicas-table tbody tr")).to_have_count(3)
    # Its own host name at the portal's proxy, as the portal's processes name it.
    base_url = re.compile(rf'base_url="http://{rows["chat"].host_label}\.localhost:{urlsplit(portal.url).port}/v1"')
    expect(page.locator("#call-python")).to_contain_text(base_url)
    drawn = "() => [...document.querySelectorAll('canvas[data-chart]')].every((c) => Chart.getChart(c) && " \
        "Chart.getChart(c).data.datasets.some((d) => d.data.some((v) => v !== null && v > 0)))"  # fmt: skip
    page.wait_for_function(drawn, timeout=LIVE_S)
    expect(page.locator("#endpoint-log")).to_have_text("(no output yet)", timeout=LIVE_S)  # no backend: no log
    at_both_widths(page, "endpoint")

    # A token, shown once, with the line that sets it for the examples.
    page.get_by_role("button", name="Make a token").click()
    expect(page.locator("#new-token")).to_contain_text("gpp_")
    expect(page.locator("#new-token-export")).to_contain_text("export ENDPOINT_TOKEN=gpp_")
    page.reload()
    expect(page.locator("#new-token")).to_have_count(0)

    # Scaled by a colleague in another process: the open page follows without a reload.
    page.evaluate("window.__not_reloaded = true")
    off_the_loop(do_update_endpoint, Endpoint.objects.get(pk=rows["chat"].pk), acting_user=people.bob, max_replicas=6)
    expect(page.locator("#endpoint-replicas")).to_contain_text("between 2 and 6", timeout=LIVE_S)
    assert page.evaluate("window.__not_reloaded") is True

    page.goto(f"{portal.url}/w/team-a/endpoints/{rows['broken'].pk}/")
    expect(page.locator("#endpoint-state [data-state]")).to_have_text("Failed")
    expect(page.locator("#endpoint-failure")).to_contain_text("failed to load model")
    expect(page.get_by_role("link", name="Delete…")).to_have_count(0)
    at_both_widths(page, "endpoint-failed")

    page.goto(f"{portal.url}/w/team-a/endpoints/")
    page.get_by_role("link", name="New endpoint").first.click()
    expect(page.get_by_label("Minimum replicas")).to_have_value("1")
    at_both_widths(page, "endpoint-new")

    # Nothing was started: no replica left the states the rows were made in.
    states = sorted(Replica.objects.values_list("name", "state"))
    assert states == [("broken-1", "FAILED"), ("chat-1", "READY"), ("chat-2", "READY"), ("chat-3", "QUEUED")]
    assert not problems, json.dumps(problems, indent=1)
