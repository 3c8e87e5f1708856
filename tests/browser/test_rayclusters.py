"""The Ray cluster pages in a real browser against the live portal (see conftest.py), at a desktop's
and a phone's width: the workspace's list and a cluster's page, styled, fitting the width, tables
stacked on the phone, nothing the page's policy refuses; and a change made in another process
(a member deletes the cluster) reaches the open page without a reload. Rows are made directly:
no Ray runs, and none is started (a running row without a backend is left alone by the host)."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from urllib.parse import urlsplit

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from apps.rayclusters.actions import do_delete_cluster
from apps.rayclusters.models import RayCluster
from tests.browser.conftest import SCREENSHOTS, Portal, off_the_loop, sign_in
from tests.personas import PASSWORD, World, make_world

pytestmark = pytest.mark.slow
LIVE_S = 30_000
WIDTHS = {"1280": {"width": 1280, "height": 860}, "390": {"width": 390, "height": 844}}
STYLED = "() => getComputedStyle(document.querySelector('main')).paddingTop !== '0px'"
FITS = "() => document.documentElement.scrollWidth <= window.innerWidth + 1"
# On a phone each table's cells show their column's name before their value.
STACKED = (
    "() => [...document.querySelectorAll('table.list td')].every("
    "(td) => getComputedStyle(td, '::before').content !== 'none')"
)
# What the page's Content-Security-Policy refuses, reported on the console.
REPORT_VIOLATIONS = """document.addEventListener('securitypolicyviolation', (e) =>
  console.error('CSP violation ' + JSON.stringify({directive: e.violatedDirective, blocked: e.blockedURI})));"""
State = RayCluster.State
NODES = [{"name": "head", "role": "head", "alive": True}] + [
    {"name": f"worker-{i}", "role": "worker", "alive": True} for i in range(3)
]


@pytest.fixture
def people(portal: Portal) -> World:
    return make_world()


def clusters(world: World) -> dict[str, RayCluster]:
    """A running cluster (every node up), a degraded one (a worker down), one waiting and one that
    failed; rows as the host leaves them, with no backend behind them."""
    now = timezone.now()
    common = {"workspace": world.team_a, "gpu_type": "h100", "created_by": world.alice}
    rows = {
        "running": RayCluster.objects.create(
            name="tune-sweep", state=State.RUNNING, workers=3, worker_gpus=Decimal(1), head_cpu_cores=2,
            head_memory_gb=8, worker_cpu_cores=4, worker_memory_gb=16, nodes=NODES, started_at=now,
            admitted_at=now, entrypoint="python tune.py --trials 20", env={"TRIALS": "20"},
            artifact_paths=["results/best.json"], description="Hyperparameter sweep of the ResNet baseline",
            **common,
        ),
        "degraded": RayCluster.objects.create(
            name="train-data", state=State.DEGRADED, workers=2, worker_gpus=Decimal(1), started_at=now,
            admitted_at=now, nodes=[*NODES[:2], {"name": "worker-1", "role": "worker", "alive": False}], **common,
        ),
        # Not admitted for an hour (backoff): the scheduler keeps it waiting and says why.
        "waiting": RayCluster.objects.create(
            name="big-ray", state=State.QUEUED, workers=4, worker_gpus=Decimal(1), eligible_at=now + timedelta(hours=1),
            wait_reason="requeued with backoff", **common,
        ),
        "failed": RayCluster.objects.create(
            name="first-try", state=State.FAILED, workers=1, started_at=now - timedelta(minutes=20),
            finished_at=now - timedelta(minutes=12), exit_code=1, failure_reason="its entrypoint exited with 1",
            entrypoint="python train.py", **common,
        ),
    }  # fmt: skip
    RayCluster.objects.filter(pk=rows["failed"].pk).update(created_at=now - timedelta(minutes=25))
    return rows


def watch(page: Page, problems: list[str]) -> None:
    page.add_init_script(REPORT_VIOLATIONS)
    page.on(
        "console",
        lambda message: (
            problems.append(message.text)
            if message.type == "error" and ("CSP violation" in message.text or "htmx" in message.text)
            else None
        ),
    )
    page.on("pageerror", lambda error: problems.append(str(error)))


def _fits(page: Page, tries: int = 20) -> bool:
    """Whether the page fits its width; asked again for up to ten seconds, as its charts redraw for a
    new width a moment later (later still on a busy machine)."""
    for _ in range(tries - 1):
        if page.evaluate(FITS):
            return True
        page.wait_for_timeout(500)
    return bool(page.evaluate(FITS))


def at_both_widths(page: Page, name: str, *, live: bool = True) -> None:
    """The page, once live, styled and fitting at 1280 px and at 390 px (tables stacked there), kept
    as two full-page pictures under SCREENSHOTS. A page that is not `live` (it shows no workspace's
    work) has no live indicator at all."""
    if live:
        expect(page.locator("#live-status")).to_have_text("Live", timeout=LIVE_S)
    else:
        expect(page.locator("#live-status")).to_have_count(0)
    for width, size in WIDTHS.items():
        page.set_viewport_size(size)
        page.wait_for_timeout(500)
        assert page.evaluate(STYLED), f"{name}: the stylesheet is not applied"
        assert _fits(page), f"{name} scrolls sideways at {width} px"
        if width == "390":
            assert page.evaluate(STACKED), f"{name}: a table is not stacked at 390 px"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size(WIDTHS["1280"])


def test_the_ray_cluster_pages_at_desktop_and_phone_widths(page: Page, portal: Portal, people: World) -> None:
    rows = clusters(people)
    problems: list[str] = []
    watch(page, problems)
    sign_in(page, portal.url, "alice", PASSWORD)
    page.goto(f"{portal.url}/w/team-a/")  # the team's workspace, from then on the menu's
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Ray clusters", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Ray clusters")
    running = page.locator('[data-raycluster="tune-sweep"]')
    expect(running).to_contain_text("Running")
    expect(running).to_contain_text("4 of 4 nodes up")
    expect(page.locator('[data-raycluster="train-data"]')).to_contain_text("down: worker-1")
    expect(page.locator('[data-raycluster="big-ray"]')).to_contain_text("backoff")
    at_both_widths(page, "raycluster-list")

    page.get_by_role("link", name="tune-sweep", exact=True).click()
    expect(page.locator("#raycluster-state [data-state]")).to_have_text("Running")
    expect(page.locator("#raycluster-nodes tbody tr")).to_have_count(4)
    # Its own host name, at the portal's proxy (which signs the browser in there as on the portal).
    dashboard = f"http://{rows['running'].host_label}.localhost:{urlsplit(portal.url).port}/"
    expect(page.get_by_role("link", name="Open dashboard ↗")).to_have_attribute("href", dashboard)
    expect(page.locator("#raycluster-log")).to_have_text("Waiting for output…", timeout=LIVE_S)  # no backend: no log
    at_both_widths(page, "raycluster")

    degraded = rows["degraded"]
    page.goto(f"{portal.url}/w/team-a/ray-clusters/{degraded.pk}/")
    expect(page.locator("#raycluster-state [data-state]")).to_have_text("Degraded")
    expect(page.locator('[data-node="worker-1"]')).to_contain_text("Down")
    at_both_widths(page, "raycluster-degraded")

    # Deleted by a colleague in another process: the open page follows, its Delete button gone.
    page.evaluate("window.__not_reloaded = true")
    off_the_loop(do_delete_cluster, RayCluster.objects.get(pk=degraded.pk), acting_user=people.bob)
    expect(page.locator("#raycluster-state [data-state]")).to_have_text("Stopped", timeout=LIVE_S)
    expect(page.get_by_role("link", name="Delete…")).to_have_count(0)
    expect(page.locator('[data-node="worker-1"]')).to_contain_text("Ended")
    assert page.evaluate("window.__not_reloaded") is True

    page.goto(f"{portal.url}/w/team-a/ray-clusters/{rows['failed'].pk}/")
    expect(page.locator("#raycluster-failure")).to_have_text("its entrypoint exited with 1")
    expect(page.locator("#raycluster-exit-code")).to_have_text("1")
    expect(page.locator("#raycluster-log")).to_have_text("(no output)", timeout=LIVE_S)
    expect(page.get_by_role("link", name="Delete…")).to_have_count(0)
    at_both_widths(page, "raycluster-failed")

    # The form, from the list's button; looked at, not sent (a cluster it made would start for real).
    page.goto(f"{portal.url}/w/team-a/ray-clusters/")
    page.get_by_role("link", name="Create a Ray cluster").first.click()
    expect(page.get_by_label("How many")).to_have_value("1")
    expect(page.get_by_label("GPU type")).to_have_value("h100")
    at_both_widths(page, "raycluster-new")

    # Nothing was started: the rows made here are as they were (but the one deleted).
    states = dict(RayCluster.objects.values_list("name", "state"))
    assert states == {"tune-sweep": "RUNNING", "train-data": "STOPPED", "big-ray": "QUEUED", "first-try": "FAILED"}
    assert not problems, json.dumps(problems, indent=1)
