"""Live updates in a real browser, in the embedded default started exactly as deploy/run.sh starts it
(SQLite, the filesystem broker, no Redis) and in the Redis setup: a job submitted from its page goes
Queued → Running → Succeeded on that page without a reload, the admin console's dashboard follows
the same changes, and the live dot says "Live" only while the scheduler loop's heartbeat, sent from
another process, arrives: with the loop stopped the pages say "Not live", and "Live" again once it
runs."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import requests
from playwright.sync_api import Browser, Page, Route, expect

from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from tests.browser.conftest import EmbeddedSite, Portal, off_the_loop, screenshot, sign_in
from tests.personas import PASSWORD, make_world

pytestmark = pytest.mark.slow
LIVE_S = 30_000  # ms: a worker start and a scheduling cycle
# Late: no heartbeat for 12 s (live.js), checked every second.
NOT_LIVE_S = 25_000
# Records every state the job's badge shows, and proves the page was never reloaded.
WATCH_STATES = """() => {
  window.__seen = [document.querySelector('#job-state [data-state]').dataset.state];
  window.__not_reloaded = true;
  new MutationObserver(() => {
    const badge = document.querySelector('#job-state [data-state]');
    const last = window.__seen[window.__seen.length - 1];
    if (badge && last !== badge.dataset.state) window.__seen.push(badge.dataset.state);
  }).observe(document.body, {subtree: true, childList: true});
}"""


@dataclass
class Setup:
    """Where to go, who submits the job, who looks at the console, and how the job is held back."""

    url: str
    data_dir: Path
    user: tuple[str, str]
    workspace: str
    admin: tuple[str, str]
    hold: Callable[[], Any]  # takes the workspace's GPUs; returns what release needs
    release: Callable[[Any], None]


def until_running(state: Callable[[], str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (now := state()) != "RUNNING":
        assert time.monotonic() < deadline, now
        time.sleep(0.2)


@contextmanager
def scheduler_stopped(data_dir: Path) -> Iterator[None]:
    """The portal's scheduler loop (found by its data directory) stopped, then let go on again."""
    marker = str(data_dir).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            scheduler = entry.name.isdigit() and b"run_scheduler" in (entry / "cmdline").read_bytes()
            if scheduler and marker in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pids[0], signal.SIGCONT)


def follow_a_job_live(page: Page, console: Page, setup: Setup, name: str) -> None:
    sign_in(console, setup.url, *setup.admin)
    console.goto(f"{setup.url}/console/")
    expect(console.locator("#live-status")).to_have_text("Live", timeout=LIVE_S)
    pending = console.locator(".stat", has_text="pending").locator("b")
    expect(pending).to_have_text("0")

    held = setup.hold()  # the job waits: Queued first, for as long as the test likes
    sign_in(page, setup.url, *setup.user)
    page.goto(f"{setup.url}/w/{setup.workspace}/jobs/new/")
    page.get_by_label("Name").fill(f"{name}-live")
    # Long enough to be seen running on a loaded machine: a page's refresh can take seconds there, and
    # 8 s once went by between two refreshes (Admitted, then Succeeded) on a machine at half speed.
    page.get_by_label("Command").fill("sleep 20; echo done")
    page.get_by_role("button", name="Submit").click()
    badge = page.locator("#job-state [data-state]")
    expect(badge).to_have_text("Queued")
    page.evaluate(WATCH_STATES)
    # Live once a heartbeat from the scheduler loop, another process, came through the layer.
    expect(page.locator("#live-status")).to_have_text("Live", timeout=LIVE_S)
    expect(pending).to_have_text("1", timeout=LIVE_S)  # the console heard it without a reload
    screenshot(console, f"{name}-console-live")

    setup.release(held)  # the worker and the scheduler loop, other processes, do the rest
    expect(badge).to_have_text("Running", timeout=LIVE_S)
    screenshot(page, f"{name}-job-running")
    expect(badge).to_have_text("Succeeded", timeout=LIVE_S)
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, f"{name}-job-succeeded-phone")
    page.set_viewport_size({"width": 1280, "height": 860})
    seen = page.evaluate("window.__seen")
    assert seen[0] == "QUEUED" and "RUNNING" in seen and seen[-1] == "SUCCEEDED", seen
    assert page.evaluate("window.__not_reloaded") is True
    expect(pending).to_have_text("0", timeout=LIVE_S)

    # Honest: without heartbeats the open pages say they are not live, and live again after.
    with scheduler_stopped(setup.data_dir):
        expect(page.locator("#live-status")).to_have_text("Not live", timeout=NOT_LIVE_S)
        expect(console.locator("#live-status")).to_have_text("Not live", timeout=NOT_LIVE_S)
        screenshot(page, f"{name}-not-live", live=False)
    expect(page.locator("#live-status")).to_have_text("Live", timeout=LIVE_S)
    expect(console.locator("#live-status")).to_have_text("Live", timeout=LIVE_S)
    assert page.evaluate("window.__not_reloaded") is True


def test_live_in_the_embedded_default(page: Page, browser: Browser, embedded_portal: EmbeddedSite) -> None:
    site = embedded_portal
    token = requests.post(
        f"{site.url}/api/v1/auth/token/", json={"username": site.username, "password": site.password}, timeout=10
    ).json()["token"]
    api = requests.Session()
    api.headers["Authorization"] = f"Token {token}"

    def hold() -> int:
        # The admin's workspace has one H100 of quota: a job that holds it keeps the next one queued.
        body = {"workspace": site.username, "name": "holder", "command": "sleep 300", "gpu_type": "h100"}
        answer = api.post(f"{site.url}/api/v1/jobs/", json={**body, "gpus_per_replica": "1"}, timeout=10)
        assert answer.status_code == 201, answer.text
        job_id = int(answer.json()["id"])
        until_running(lambda: api.get(f"{site.url}/api/v1/jobs/{job_id}/", timeout=10).json()["state"])
        return job_id

    def release(job_id: int) -> None:
        api.post(f"{site.url}/api/v1/jobs/{job_id}/cancel/", timeout=10).raise_for_status()

    setup = Setup(
        url=site.url,
        data_dir=site.data_dir,
        user=(site.username, site.password),
        workspace=site.username,
        admin=(site.username, site.password),
        hold=hold,
        release=release,
    )
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        follow_a_job_live(page, context.new_page(), setup, "embedded")
    finally:
        context.close()


def test_live_in_the_redis_setup(page: Page, browser: Browser, portal: Portal) -> None:
    world = make_world()

    def hold() -> Job:
        # Bob's job takes all of team-a's 4 H100.
        job = off_the_loop(
            check_submit_job,
            world.team_a,
            name="holder",
            command="sleep 300",
            gpu_type="h100",
            gpus_per_replica=Decimal(4),
            acting_user=world.bob,
        )
        until_running(lambda: Job.objects.get(pk=job.pk).state)
        return job

    def release(job: Job) -> None:
        off_the_loop(do_cancel_job, job, acting_user=world.bob)

    setup = Setup(
        url=portal.url,
        data_dir=portal.data_dir,
        user=("alice", PASSWORD),
        workspace="team-a",
        admin=("admin", PASSWORD),
        hold=hold,
        release=release,
    )
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        follow_a_job_live(page, context.new_page(), setup, "redis")
    finally:
        context.close()
    a_change_heard_during_a_refresh_is_shown(page, Job.objects.get(name="redis-live"))


def a_change_heard_during_a_refresh_is_shown(page: Page, job: Job) -> None:
    """A change pushed while the status part's last refresh is still out is shown once that refresh
    returns, though the refresh brings the state before it. (Were the part's element replaced by its
    refresh, htmx would drop the refresh queued for the second change: the page once said Admitted
    for the whole run of a job, then Succeeded.) The portal's state is set here directly, and a
    change heard is an event on the page, so that the order is exact."""
    held: list[Route] = []

    def hold_the_first(route: Route) -> None:
        if held:
            route.continue_()
        else:
            held.append(route)

    badge = page.locator("#job-state [data-state]")
    expect(badge).to_have_text("Succeeded")
    page.route(f"**/jobs/{job.pk}/?part=status&shown=*", hold_the_first)
    Job.objects.filter(pk=job.pk).update(state=Job.State.FAILED)
    page.evaluate(f"document.body.dispatchEvent(new CustomEvent('live-job-{job.pk}', {{bubbles: true}}))")
    page.wait_for_timeout(1000)  # past the part's 150 ms delay: its refresh is out, and held
    assert len(held) == 1
    stale = held[0].fetch()  # says Failed
    Job.objects.filter(pk=job.pk).update(state=Job.State.CANCELLED)
    page.evaluate(f"document.body.dispatchEvent(new CustomEvent('live-job-{job.pk}', {{bubbles: true}}))")
    page.wait_for_timeout(1000)  # the second refresh waits, queued behind the first
    held[0].fulfill(response=stale)
    expect(badge).to_have_text("Cancelled", timeout=10_000)
    page.unroute(f"**/jobs/{job.pk}/?part=status&shown=*")
