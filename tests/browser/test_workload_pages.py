"""The pages of jobs, instances and notebooks (the generic list and detail pages, apps/web/generic.py)
in a real browser against the live portal (see conftest.py), at a desktop's and a phone's width:
styled, fitting the width, tables stacked on the phone, nothing the page's policy refuses; each
page's state followed live, its actions offered while they apply, and its confirmation pages.

The job and the instance run for real (the local backend); the notebooks are rows made directly,
stopped and failed ones, which the host leaves alone (a notebook that runs needs Jupyter: the
journeys open one, tests/browser/test_journeys.py)."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from apps.compute.actions import check_launch_instance
from apps.compute.models import Instance, Notebook
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from tests.browser.conftest import Portal, off_the_loop, sign_in
from tests.browser.test_rayclusters import at_both_widths, watch
from tests.personas import PASSWORD, World, make_world

pytestmark = pytest.mark.slow
LIVE_S = 30_000  # ms: a worker start and a scheduling cycle


@pytest.fixture
def people(portal: Portal) -> World:
    return make_world()


def test_a_jobs_page_from_the_queue_to_its_artifact(page: Page, portal: Portal, people: World) -> None:
    world = people
    problems: list[str] = []
    watch(page, problems)
    # Bob's job holds all of team-a's 4 H100: alice's waits for it, saying why.
    bobs = off_the_loop(
        check_submit_job, world.team_a, name="holder", command="sleep 300", gpu_type="h100",
        gpus_per_replica=Decimal(4), acting_user=world.bob,
    )  # fmt: skip
    job = off_the_loop(
        check_submit_job, world.team_a, name="train", description="Two replicas, one H100 each",
        command="echo PROGRESS 0.5; echo trained > model.txt; echo done", gpu_type="h100",
        gpus_per_replica=Decimal(1), replicas=2, env={"EPOCHS": "3"}, artifact_paths=["model.txt"],
        acting_user=world.alice,
    )  # fmt: skip
    sign_in(page, portal.url, "alice", PASSWORD)
    page.goto(f"{portal.url}/w/team-a/jobs/{job.pk}/")
    expect(page.get_by_role("heading", level=1)).to_have_text("train")
    expect(page.locator("#job-state [data-state]")).to_have_text("Queued")
    expect(page.locator("#job-reason")).to_contain_text("quota", timeout=LIVE_S)
    expect(page.get_by_role("link", name="Cancel job…")).to_be_visible()  # to a question first
    expect(page.locator("#job-log")).to_have_text("The log starts when the job does.")
    expect(page.get_by_label("Replica")).to_have_count(1)  # a gang of two: the log of either
    expect(page.locator("#job-what-it-runs")).to_contain_text("EPOCHS=3")
    at_both_widths(page, "pages-job-queued")
    # Cancelling asks first; keeping it changes nothing.
    page.get_by_role("link", name="Cancel job…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Cancel job train?")
    at_both_widths(page, "pages-job-cancel")
    page.get_by_role("link", name="Keep it").click()
    expect(page.locator("#job-state [data-state]")).to_have_text("Queued")

    # The pages around the work: the API tokens (nothing live: no live indicator) and the members.
    page.goto(f"{portal.url}/tokens/")
    at_both_widths(page, "pages-tokens", live=False)
    page.goto(f"{portal.url}/w/team-a/members/")
    expect(page.locator('[data-member="alice"]')).to_contain_text("The last owner stays")
    at_both_widths(page, "pages-members")
    page.goto(f"{portal.url}/w/team-a/jobs/{job.pk}/")

    page.evaluate("window.__not_reloaded = true")
    off_the_loop(do_cancel_job, bobs, acting_user=world.bob)  # bob gives his GPUs back
    expect(page.locator("#job-state [data-state]")).to_have_text("Succeeded", timeout=LIVE_S)
    expect(page.get_by_role("link", name="Cancel job…")).to_have_count(0)  # the live update took it away
    expect(page.locator("#job-progress")).to_contain_text("100")
    expect(page.get_by_role("link", name="model.txt")).to_be_visible(timeout=LIVE_S)
    expect(page.locator("#job-log")).to_contain_text("done", timeout=LIVE_S)
    assert page.evaluate("window.__not_reloaded") is True
    at_both_widths(page, "pages-job-succeeded")

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Jobs", exact=True).click()
    page.get_by_role("navigation", name="Which jobs").get_by_role("link", name="All").click()
    expect(page.locator('[data-job="train"]')).to_contain_text("Succeeded")
    expect(page.locator('[data-job="holder"]')).to_contain_text("Cancelled")
    at_both_widths(page, "pages-jobs")
    assert Job.objects.get(pk=job.pk).state == Job.State.SUCCEEDED

    # The month's GPU-hours: each figure's header stands over it, on the right.
    page.goto(f"{portal.url}/w/team-a/usage/report/")
    expect(page.locator('tr[data-row="total"]')).to_be_visible()
    for header in page.locator("table.list th.num").all():
        assert header.evaluate("th => getComputedStyle(th).textAlign") == "right", header.text_content()
    at_both_widths(page, "pages-usage")
    assert not problems, json.dumps(problems, indent=1)


def test_an_instance_its_notebooks_and_their_confirmations(page: Page, portal: Portal, people: World) -> None:
    world = people
    problems: list[str] = []
    watch(page, problems)
    sign_in(page, portal.url, "alice", PASSWORD)
    box = off_the_loop(
        check_launch_instance, world.team_a, name="dev-box", description="Data preparation",
        profile=world.cpu_small, acting_user=world.alice,
    )  # fmt: skip
    stopped = Notebook.objects.create(
        workspace=world.team_a, instance=box, name="lab", profile=world.minimal, state=Notebook.State.STOPPED,
        stop_reason="culled: idle for 2 h", started_at=timezone.now(), finished_at=timezone.now(),
        created_by=world.alice,
    )  # fmt: skip
    Notebook.objects.create(
        workspace=world.team_a, instance=box, name="broken", profile=world.minimal, state=Notebook.State.FAILED,
        failure_reason="Jupyter exited with 1 before it answered", created_by=world.alice,
    )  # fmt: skip

    # The instance's page follows it to Running without a reload; its actions are a member's.
    page.goto(f"{portal.url}/w/team-a/instances/{box.pk}/")
    page.evaluate("window.__not_reloaded = true")
    expect(page.locator("#instance-status [data-state]")).to_have_text("Running", timeout=LIVE_S)
    assert page.evaluate("window.__not_reloaded") is True
    for action in ("New notebook on it", "Delete…"):
        expect(page.locator("#instance-actions").get_by_role("link", name=action)).to_be_visible()
    expect(page.locator("#instance-status")).to_contain_text("2 CPU, 8 GB")
    expect(page.locator("#instance-notebooks")).to_contain_text("No notebook yet")  # none of them runs
    expect(page.locator("#collaborators")).to_contain_text("Not shared with anyone")
    expect(page.get_by_role("button", name="Save description")).to_be_visible()
    at_both_widths(page, "pages-instance")

    page.goto(f"{portal.url}/w/team-a/instances/")
    expect(page.locator('[data-instance="dev-box"]')).to_contain_text("Running")
    at_both_widths(page, "pages-instances")

    # The notebooks: the one the portal stopped is live (it can start again), with why it stopped.
    page.goto(f"{portal.url}/w/team-a/notebooks/")
    expect(page.locator('[data-notebook="lab"]')).to_contain_text("Stopped")
    expect(page.locator('[data-notebook="broken"]')).to_contain_text("Failed")
    at_both_widths(page, "pages-notebooks")
    page.get_by_role("link", name="lab", exact=True).click()
    expect(page.locator("#notebook-status [data-state]")).to_have_text("Stopped")
    expect(page.locator("[data-stop-reason]")).to_contain_text("culled: idle for 2 h")
    expect(page.get_by_role("button", name="Start again")).to_be_visible()
    expect(page.get_by_role("link", name="Delete…")).to_have_count(0)  # a stopped notebook is deleted already
    expect(page.locator("#nb-token")).to_have_text(stopped.access_token)
    at_both_widths(page, "pages-notebook-stopped")
    copy = page.get_by_role("button", name="Copy").bounding_box()
    assert copy is not None and copy["height"] < 2 * copy["width"], copy  # one line, not a letter a line
    # Started again: the message says so while it is starting, and goes once it no longer is.
    page.get_by_role("button", name="Start again").click()
    expect(page.locator("#flash")).to_contain_text("Notebook lab is starting again.")
    rendered = (page.locator("#notebook-live").get_attribute("hx-get") or "").split("shown=")[1]
    # A Jupyter start, its environment built first where none was yet: as long as the journeys allow.
    expect(page.locator(f'#notebook-status [data-state="{rendered}"]')).to_have_count(0, timeout=120_000)
    expect(page.locator("#flash p")).to_have_count(0)
    at_both_widths(page, "pages-notebook-started")

    # Deleting asks first, and says what it does.
    page.goto(f"{portal.url}/w/team-a/notebooks/")
    page.get_by_role("link", name="broken", exact=True).click()
    expect(page.locator("#notebook-status")).to_contain_text("Jupyter exited with 1")
    page.locator("#notebook-actions").get_by_role("link", name="Delete…").click()
    expect(page.get_by_role("alertdialog")).to_contain_text("Files it saved stay")
    at_both_widths(page, "pages-notebook-delete")
    page.get_by_role("button", name="Delete permanently").click()
    expect(page.locator(".flash")).to_contain_text("Notebook broken was deleted.")

    page.goto(f"{portal.url}/w/team-a/instances/{box.pk}/")
    page.locator("#instance-actions").get_by_role("link", name="Delete…").click()
    expect(page.get_by_role("alertdialog")).to_contain_text("irreversible")
    at_both_widths(page, "pages-instance-delete")
    page.get_by_role("button", name="Delete permanently").click()
    expect(page.locator(".flash")).to_contain_text("Instance dev-box was deleted.")
    page.goto(f"{portal.url}/w/team-a/instances/{box.pk}/")
    expect(page.locator("#instance-status [data-state]")).to_have_text("Deleted", timeout=LIVE_S)
    expect(page.locator("#instance-actions a")).to_have_count(0)  # nothing applies to a deleted instance
    assert Instance.objects.get(pk=box.pk).state == Instance.State.DELETED
    assert not problems, json.dumps(problems, indent=1)
