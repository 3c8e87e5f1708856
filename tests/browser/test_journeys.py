"""End-to-end journeys in a real browser against the live portal (see conftest.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from apps.catalog.models import NotebookProfile
from apps.compute.models import Instance, Notebook
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Job
from tests.browser.conftest import EmbeddedSite, Portal, off_the_loop, screenshot
from tests.browser.conftest import sign_in as sign_in_as
from tests.mail import Mailbox, body_of, smtp_server
from tests.personas import PASSWORD, World, make_world

pytestmark = pytest.mark.slow
LIVE_S = 30_000  # how long a live update may take, in ms: a worker start and a scheduling cycle

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


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    with smtp_server() as box:
        yield box


@pytest.fixture
def portal_settings(mailbox: Mailbox) -> dict[str, str]:
    """The portal sends its mail (invitations) to a real SMTP server on loopback."""
    return {"EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(mailbox.port), "EMAIL_USE_TLS": "false"}


@pytest.fixture
def people(portal: Portal) -> World:
    world = make_world()
    # A notebook environment of just the Jupyter server and a kernel (built once per machine, cached).
    NotebookProfile.objects.create(
        name="kernel-only", display_name="Python kernel", image="quay.io/jupyter/base-notebook", published=True
    )
    return world


def nav(page: Page, name: str) -> Locator:
    return page.get_by_role("navigation", name="Main").get_by_role("link", name=name, exact=True)


def sign_in(page: Page, portal: Portal, username: str) -> None:
    page.goto(f"{portal.url}/")
    expect(page).to_have_url(f"{portal.url}/login/?next=/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Welcome")


def launch_instance(page: Page, name: str, size: str) -> None:
    nav(page, "Instances").click()
    page.get_by_role("link", name="Launch an instance").first.click()
    page.get_by_label("Name").fill(name)
    page.get_by_label("Name").press("Enter")  # the keyboard moves the wizard on
    expect(page.locator('.steps li[aria-current="step"]')).to_have_text("Size")
    page.locator(f'[data-profile="{size}"] input').check()
    screenshot(page, "wizard")
    page.get_by_role("button", name="Next").click()
    expect(page.locator('.steps li[aria-current="step"]')).to_have_text("Launch")
    page.get_by_role("button", name="Launch").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(name)


def invite_and_revoke(page: Page, portal: Portal, mailbox: Mailbox, notebook: Notebook) -> None:
    """Alice shares her instance with dana by email, from its Collaborators panel: dana follows the
    mailed link on her phone, makes her account, finds the instance (and nothing else of team-a)
    and opens its notebook; removed, her open JupyterLab is refused its next request."""
    instance_url = f"{portal.url}/w/team-a/instances/{notebook.instance_id}/"
    page.goto(instance_url)
    panel = page.locator("#collaborators")
    panel.get_by_role("textbox", name="Email").fill("dana@example.org")
    panel.get_by_label("Access").select_option("write")
    panel.get_by_role("button", name="Invite").click()
    expect(page.locator(".flash")).to_contain_text("dana@example.org was invited to dev-box, read-write")
    expect(page.locator('#collaborators [data-invitation="dana@example.org"]')).to_contain_text("Waiting")
    page.locator("#collaborators").scroll_into_view_if_needed()
    screenshot(page, "collaborators-invited")
    [mail] = mailbox.wait_for(1)
    link = re.search(r"(http://\S+/invitations/[A-Za-z0-9_-]+/)", body_of(mail))
    assert link and mail["To"] == "dana@example.org"

    dana = page.context.browser.new_context(viewport={"width": 390, "height": 844})  # her phone
    try:
        guest = dana.new_page()
        guest.goto(link.group(1))
        expect(guest.get_by_role("heading", level=1)).to_have_text("You are invited")
        expect(guest.locator(".invitation")).to_contain_text("the instance dev-box of the workspace team-a")
        screenshot(guest, "invitation-phone", live=False)
        guest.get_by_label("Username").fill("dana")
        guest.get_by_label("Password", exact=True).fill(PASSWORD)
        guest.get_by_label("Password again").fill(PASSWORD)
        guest.get_by_role("button", name="Make my account and accept").click()
        expect(guest.locator(".flash")).to_contain_text("Instance dev-box of team-a is shared with you, read-write")
        expect(guest.get_by_role("heading", level=1)).to_have_text("dev-box")
        expect(guest.locator("#live-status")).to_have_text("Live", timeout=LIVE_S)  # the instance's own socket
        assert guest.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        screenshot(guest, "shared-instance-phone")
        guest.get_by_role("link", name=notebook.name, exact=True).click()
        with dana.expect_page() as opened:
            guest.get_by_role("link", name="Open Jupyter").click()
        lab = opened.value
        lab.wait_for_load_state()
        assert lab.title() == "JupyterLab", lab.url
        assert lab.evaluate(RUN_CELL, {"code": "print('dana here')"}) == "dana here\n"

        # What her JupyterLab asks of its server: answered now; sent back to sign in once removed.
        status = (
            "() => fetch('/api/contents', {redirect: 'manual'}).then(r => r.type == 'opaqueredirect' ? 0 : r.status)"
        )
        assert lab.evaluate(status) == 200
        page.goto(instance_url)
        page.locator('[data-collaborator="dana"]').get_by_role("button", name="Remove").click()
        expect(page.locator(".flash")).to_contain_text("dana no longer has access to dev-box")
        for _ in range(50):  # the notebook's server asks the portal again at most a second later
            if lab.evaluate(status) != 200:
                break
            lab.wait_for_timeout(200)
        assert lab.evaluate(status) in (0, 403)
        guest.goto(instance_url)
        expect(guest.get_by_role("heading", level=1)).to_have_text("Page not found")
    finally:
        dana.close()


def test_a_newcomer_launches_an_instance_a_notebook_and_a_job(
    page: Page, portal: Portal, people: World, mailbox: Mailbox
) -> None:
    world = people
    # Bob's long job holds 3 of team-a's 4 H100: alice's job will have to wait for it.
    bobs = check_submit_job(
        world.team_a,
        name="bobs-long-run",
        command="sleep 300",
        gpu_type="h100",
        gpus_per_replica=Decimal(3),
        acting_user=world.bob,
    )
    # 1. sign in
    sign_in(page, portal, "alice")
    page.get_by_label("Workspace").select_option("team-a")
    expect(page).to_have_url(f"{portal.url}/w/team-a/")

    # 2. launch an instance through the wizard; its status turns Running without a reload
    launch_instance(page, "dev-box", "gpu-1")
    expect(page.locator("#instance-status [data-state]")).to_have_text("Running", timeout=LIVE_S)
    instance = Instance.objects.get(name="dev-box")

    # 3. launch a notebook on it, from the instance's page
    page.get_by_role("link", name="New notebook on it").click()
    page.get_by_label("Name").fill("lab")
    page.get_by_label("Environment").select_option("kernel-only")
    page.get_by_role("button", name="Start notebook").click()
    expect(page.locator("#notebook-status [data-state]")).to_have_text("Ready", timeout=120_000)
    # Its token's Copy button answers although a live update rendered it (the status became Ready)
    copy = page.locator("#notebook-status [data-copy]")
    copy.click()
    expect(copy).to_have_text(re.compile("^(Copied|Select and copy)$"))

    # 4. open it and run a cell: it opens on a host of its own, where the portal's sign-in is
    # handed over (a one-time code) and Jupyter's own session runs the kernel
    notebook = Notebook.objects.get(name="lab", workspace=world.team_a)
    with page.context.expect_page() as opened:
        page.get_by_role("link", name="Open Jupyter").click()
    jupyter = opened.value
    jupyter.wait_for_load_state()
    # The portal's own link lands in JupyterLab (not the server's bare root page).
    root = f"http://lab-{notebook.pk}.localhost:{urlsplit(portal.url).port}/lab"
    if jupyter.url != root:
        # Under a loaded CI machine the sign-in callback has, rarely, answered instead of
        # redirecting (its body says why); a person would click the link again, and so does this.
        first = (jupyter.url, jupyter.content()[:300])
        jupyter.close()
        with page.context.expect_page() as opened:
            page.get_by_role("link", name="Open Jupyter").click()
        jupyter = opened.value
        jupyter.wait_for_load_state()
        assert jupyter.url == root, first
    assert jupyter.title() == "JupyterLab"
    output = jupyter.evaluate(RUN_CELL, {"code": "print(6 * 7)"})
    assert output == "42\n"
    # The SDK is ready in its kernel: a job submitted from it runs in the notebook's workspace.
    sdk_cell = (
        "from gpuportal import Client\n"
        "job = Client.from_env().jobs.submit(name='from-the-lab', command='echo hi')\n"
        "job.wait(timeout=45)\nprint(job.state, job.workspace)"
    )
    assert jupyter.evaluate(RUN_CELL, {"code": sdk_cell}) == "SUCCEEDED team-a\n"
    jupyter.close()

    # 4b. share the instance with a colleague by email: she follows the mailed link, makes her
    # account, opens the same notebook; removed, her open notebook refuses her next request
    invite_and_revoke(page, portal, mailbox, notebook)

    # 5. submit a 1-GPU job and watch it go queued -> running -> succeeded, without reloading
    nav(page, "Jobs").click()
    page.get_by_role("link", name="Submit a job").first.click()
    page.get_by_label("Name").fill("hello-gpu")
    page.get_by_label("Command").fill(
        'echo "on GPU $CUDA_VISIBLE_DEVICES"; for p in 0.3 0.6 0.9; do echo PROGRESS $p; sleep 1; done; '
        "echo trained > model.txt"
    )
    page.get_by_label("GPUs per replica").fill("1")
    page.get_by_label("Artifacts to keep").fill("model.txt")
    page.get_by_role("button", name="Submit").click()
    expect(page.locator("#job-state [data-state]")).to_have_text("Queued")
    expect(page.locator("#job-reason")).to_contain_text("quota", timeout=LIVE_S)
    page.evaluate(WATCH_STATES)
    screenshot(page, "job-queued")
    nav(page, "Jobs").click()
    expect(page.locator('[data-job="hello-gpu"]')).to_contain_text("quota")
    screenshot(page, "job-queue")
    page.go_back()
    page.evaluate(WATCH_STATES)
    off_the_loop(do_cancel_job, bobs, acting_user=world.bob)  # bob gives his GPUs back
    expect(page.locator("#job-state [data-state]")).to_have_text("Succeeded", timeout=LIVE_S)
    seen = page.evaluate("window.__seen")
    assert seen[0] == "QUEUED" and seen[-1] == "SUCCEEDED" and "RUNNING" in seen, seen
    assert page.evaluate("window.__not_reloaded") is True
    expect(page.locator("#job-log")).to_contain_text("on GPU", timeout=LIVE_S)

    # 6. download its artifact
    with page.expect_download() as download:
        page.get_by_role("link", name="model.txt").click()
    assert Path(download.value.path()).read_text() == "trained\n"

    screenshot_landing(page, portal)

    # 7. delete the instance, after a confirmation that says it is irreversible
    page.goto(f"{portal.url}/w/team-a/instances/{instance.pk}/")
    page.get_by_role("link", name="Delete…").click()
    expect(page.get_by_role("alertdialog")).to_contain_text("irreversible")
    page.get_by_role("button", name="Delete permanently").click()
    expect(page.locator(".flash")).to_contain_text("Instance dev-box was deleted.")
    instance.refresh_from_db()
    assert instance.state in (Instance.State.DELETING, Instance.State.DELETED)


# A data scientist's first cell, on one line as a person would paste it.
FIRST_CELL = (
    "from gpuportal import Client; job = Client.from_env().jobs.submit(name='first-cell', "
    "command='echo hello from a job'); job.wait(timeout=120); print(job.state, job.logs())"
)


def test_a_data_scientists_first_cell_submits_a_job_from_jupyterlab(page: Page, embedded_portal: EmbeddedSite) -> None:
    """In the embedded default, with nothing set up by hand: the portal's "Open Jupyter" link opens
    JupyterLab, whose first notebook cell submits a job through the SDK and sees it succeed."""
    site = embedded_portal
    sign_in_as(page, site.url, site.username, site.password)
    launch_instance(page, "box", "cpu-small")
    expect(page.locator("#instance-status [data-state]")).to_have_text("Running", timeout=LIVE_S)
    page.get_by_role("link", name="New notebook on it").click()
    page.get_by_label("Name").fill("lab")
    page.get_by_label("Environment").select_option("minimal")
    page.get_by_role("button", name="Start notebook").click()
    expect(page.locator("#notebook-status [data-state]")).to_have_text("Ready", timeout=120_000)
    # The notebook's page, at a desktop's and a phone's width: styled, no sideways scrolling.
    for width, height in ((1280, 860), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(300)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), width
        copy = page.get_by_role("button", name="Copy").bounding_box()
        assert copy is not None and copy["height"] < 2 * copy["width"], copy  # one line, not a letter a line
        screenshot(page, f"embedded-notebook-{width}")
    page.set_viewport_size({"width": 1280, "height": 860})

    with page.context.expect_page() as opened:
        page.get_by_role("link", name="Open Jupyter").click()
    jupyter = opened.value
    expect(jupyter).to_have_title("JupyterLab", timeout=60_000)
    assert urlsplit(jupyter.url).path == "/lab"
    # No prompt to fetch Jupyter's news from outside: the server has the feed turned off.
    config = jupyter.evaluate("() => JSON.parse(document.getElementById('jupyter-config-data').textContent)")
    assert config["news"] == {"disabled": True}
    notification = jupyter.evaluate(
        "async () => (await fetch('/lab/api/settings/@jupyterlab/apputils-extension:notification')).json()"
    )
    assert notification["schema"]["properties"]["fetchNews"]["default"] == "false"  # so JupyterLab never asks
    # A new notebook from JupyterLab's launcher, and the cell typed (pasted) into it and run.
    jupyter.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
    cell = jupyter.locator(".jp-Notebook .jp-Cell").first
    expect(jupyter.locator(".jp-Notebook-ExecutionIndicator[data-status=idle]")).to_be_visible(timeout=60_000)
    run_first_cell(cell)
    output = cell.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stdout"]')
    expect(output).to_contain_text("SUCCEEDED hello from a job", timeout=150_000)
    # ...and nothing in red beside it: neither the SDK nor the kernel has anything to complain of.
    errors = cell.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    assert errors.count() == 0, errors.all_inner_texts()
    screenshot(jupyter, "jupyterlab-first-cell")
    jupyter.close()

    # The job is the portal's like any other: on its jobs page, submitted by the notebook's user.
    nav(page, "Jobs").click()
    page.get_by_role("navigation", name="Which jobs").get_by_role("link", name="All").click()
    expect(page.locator('[data-job="first-cell"]')).to_contain_text("Succeeded")


def run_first_cell(cell: Locator) -> None:
    """Paste FIRST_CELL into the cell's editor and run it (Shift+Enter), as a person would; typed
    again if the editor was still being set up and dropped the text (the cell then never ran)."""
    editor, prompt = cell.locator(".cm-content"), cell.locator(".jp-InputPrompt")
    for _ in range(3):
        expect(editor).to_be_visible(timeout=30_000)
        editor.click()
        expect(editor).to_be_focused()
        cell.page.keyboard.insert_text(FIRST_CELL)
        expect(editor).to_contain_text("Client.from_env()")
        cell.page.keyboard.press("Shift+Enter")
        try:  # it runs: "[*]:", then its number
            expect(prompt).to_have_text(re.compile(r"\[(\*|\d+)\]"), timeout=10_000)
            return
        except AssertionError:
            cell.page.keyboard.press("Escape")
            editor.click()
            cell.page.keyboard.press("Control+a")
            cell.page.keyboard.press("Delete")
    raise AssertionError("the first cell never ran")


def screenshot_landing(page: Page, portal: Portal) -> None:
    page.goto(f"{portal.url}/")
    expect(page.locator('[data-count="instances"]')).to_have_text("1")
    screenshot(page, "landing")


def test_an_admin_publishes_a_profile_and_lowers_a_quota(browser: Browser, portal: Portal, people: World) -> None:
    world = people
    # Charlie's job holds one H100 of team-b.
    charlies = off_the_loop(
        check_submit_job,
        world.team_b,
        name="charlies-run",
        command="sleep 300",
        gpu_type="h100",
        gpus_per_replica=Decimal(1),
        acting_user=world.charlie,
    )
    admin = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
    user = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
    sign_in(admin, portal, "admin")
    sign_in(user, portal, "charlie")

    # publish a new profile: it appears in a user's wizard at once
    admin.goto(f"{portal.url}/console/profiles/compute/new/")
    admin.get_by_label("Name", exact=True).fill("gpu-2")
    admin.get_by_label("Display name").fill("Two H100")
    admin.get_by_label("GPU type").fill("h100")
    admin.get_by_label("GPUs", exact=True).fill("2")
    admin.get_by_label("CPU cores").fill("16")
    admin.get_by_label("Memory (GB)").fill("128")
    admin.get_by_label("Published: users can launch it now").check()
    admin.get_by_role("button", name="Save").click()
    expect(admin.locator('[data-profile="gpu-2"]')).to_contain_text("Published")
    user.goto(f"{portal.url}/w/team-b/instances/new/")
    user.get_by_label("Name").fill("big-box")
    user.get_by_role("button", name="Next").click()
    expect(user.locator('[data-profile="gpu-2"]')).to_contain_text("Two H100")
    expect(user.locator('[data-profile="gpu-2"]')).to_contain_text("2 × H100")

    # lower a quota: the user's next job waits, saying why
    admin.goto(f"{portal.url}/console/workspaces/team-b/")
    quota = admin.get_by_role("form", name="Set a GPU quota")
    quota.get_by_label("GPU type").fill("h100")
    quota.get_by_label("GPUs", exact=True).fill("1")
    quota.get_by_role("button", name="Set quota").click()
    expect(admin.locator(".flash")).to_contain_text("Quota of team-b: 1 × h100")
    user.goto(f"{portal.url}/w/team-b/jobs/new/")
    user.get_by_label("Name").fill("after-cut")
    user.get_by_label("Command").fill("true")
    user.get_by_role("button", name="Submit").click()
    job = Job.objects.get(name="after-cut")
    expect(user.locator("#job-reason")).to_contain_text("h100", timeout=LIVE_S)
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED and job.wait_reason
    expect(user.locator("#job-reason")).to_have_text(job.wait_reason)

    admin.goto(f"{portal.url}/console/")
    expect(admin.locator("#queue-title")).to_be_visible()
    expect(admin.locator("#console-body")).to_contain_text("after-cut")
    # A function, not a string to evaluate: the pages' Content-Security-Policy refuses eval.
    admin.wait_for_function("() => document.querySelector('[data-chart-url]').dataset.loaded")
    screenshot(admin, "admin-dashboard")

    # the pages work at a phone's width: no sideways scrolling
    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    small = phone.new_page()
    sign_in(small, portal, "charlie")
    small.goto(f"{portal.url}/w/team-b/jobs/")
    assert small.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    screenshot(small, "jobs-phone")
    off_the_loop(do_cancel_job, charlies, acting_user=world.charlie)


# Runs one cell on the notebook's Jupyter server from the browser: a kernel over the REST API,
# then an execute_request over the kernel's WebSocket; resolves with what the cell printed.
# What Jupyter's own page does: its session cookie, and its XSRF cookie echoed in a header.
RUN_CELL = """async ({code}) => {
  const xsrf = decodeURIComponent((document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || ['', ''])[1]);
  const headers = {'X-XSRFToken': xsrf, 'Content-Type': 'application/json'};
  const body = '{"name": "python3"}';
  const kernel = await (await fetch('/api/kernels', {method: 'POST', headers, body})).json();
  const url = `ws://${location.host}/api/kernels/${kernel.id}/channels`;
  return await new Promise((resolve, reject) => {
    const socket = new WebSocket(url);
    const id = crypto.randomUUID();
    let out = '';
    socket.onopen = () => socket.send(JSON.stringify({
      header: {msg_id: id, msg_type: 'execute_request', username: '', session: id, version: '5.3', date: ''},
      parent_header: {}, metadata: {}, channel: 'shell',
      content: {code, silent: false, store_history: false, user_expressions: {}, allow_stdin: false}}));
    socket.onmessage = (event) => {
      const msg = JSON.parse(event.data);
      if (msg.parent_header.msg_id !== id) return;
      if (msg.msg_type === 'stream') out += msg.content.text;
      if (msg.msg_type === 'status' && msg.content.execution_state === 'idle') { socket.close(); resolve(out); }
    };
    socket.onerror = () => reject(new Error('kernel socket failed'));
    setTimeout(() => reject(new Error('no answer from the kernel')), 60000);
  });
}"""
