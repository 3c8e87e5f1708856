"""A notebook's pages live on an origin of their own, in a real browser against the live portal.

The attack of the security review: a page served by alice's notebook, opened by bob (signed in to
the portal, a member of alice's workspace, owner of his own), tries to act as bob on the portal.
It runs twice on the notebook's origin: as a file Jupyter serves (``/files/``, which Jupyter
confines with a CSP sandbox) and as script running in the notebook's own pages (what a cell's
HTML output does), and once, as the control, on the portal's own origin, where the same script
does make alice an owner of bob's workspace: the test would fail with notebooks on the portal's
origin, as they were.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, Request, expect

from apps.catalog.models import NotebookProfile
from apps.compute.models import Instance, Notebook
from apps.workspaces.models import Membership, Workspace
from tests.browser.conftest import Portal
from tests.browser.test_journeys import sign_in
from tests.personas import World, make_world
from tests.proxy import browser_session

pytestmark = pytest.mark.slow

# Reads the portal's API and pages and tries to make alice an owner of bob's workspace, with the
# portal's CSRF token where the page can read it; reports what it got.
ATTACK = """async ({portal, workspace}) => {
  const out = {};
  try { out.cookie = document.cookie; } catch (e) { out.cookie = 'blocked: ' + e.name; }
  const csrf = ((out.cookie || '').match(/(?:^|; )csrftoken=([^;]*)/) || ['', ''])[1];
  for (const path of ['/api/v1/workspaces/', '/api/v1/memberships/', '/w/' + workspace + '/']) {
    try {
      const answer = await fetch(portal + path, {credentials: 'include'});
      out['read ' + path] = answer.status + ' ' + (await answer.text()).slice(0, 100);
    } catch (e) { out['read ' + path] = 'blocked: ' + e.name; }
  }
  const body = JSON.stringify({workspace, user: 'alice', role: 'owner'});
  try {
    const answer = await fetch(portal + '/api/v1/memberships/', {method: 'POST', credentials: 'include',
      headers: {'Content-Type': 'application/json', 'X-CSRFToken': csrf}, body});
    out.post = answer.status;
  } catch (e) { out.post = 'blocked: ' + e.name; }
  try {  // a request the browser sends without asking the portal first (no CORS preflight)
    await fetch(portal + '/api/v1/memberships/', {method: 'POST', mode: 'no-cors', credentials: 'include',
      headers: {'Content-Type': 'text/plain'}, body});
    out.simple_post = 'sent';
  } catch (e) { out.simple_post = 'blocked: ' + e.name; }
  return out;
}"""

ATTACK_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>notes</title></head><body>
<script>
(%s)(%s).then((out) => { document.body.dataset.result = JSON.stringify(out); });
</script></body></html>"""


@pytest.fixture
def people(portal: Portal) -> World:
    world = make_world()
    NotebookProfile.objects.create(name="kernel-only", image="quay.io/jupyter/base-notebook", published=True)
    return world


def _launch_notebook(world: World) -> tuple[Instance, Notebook]:
    """alice's notebook in team-a, through the API, started by the portal's worker."""
    client = world.client(world.alice)
    body = {"workspace": "team-a", "name": "box", "profile": "cpu-small"}
    instance = Instance.objects.get(pk=client.post("/api/v1/instances/", body, format="json").json()["id"])
    body = {"workspace": "team-a", "name": "lab", "instance": instance.pk, "profile": "kernel-only"}
    notebook = Notebook.objects.get(pk=client.post("/api/v1/notebooks/", body, format="json").json()["id"])
    deadline = time.monotonic() + 180
    while notebook.state not in (Notebook.State.READY, Notebook.State.FAILED) and time.monotonic() < deadline:
        time.sleep(0.5)
        notebook.refresh_from_db()
    assert notebook.state == Notebook.State.READY, notebook.failure_reason
    instance.refresh_from_db()
    return instance, notebook


def _origin(portal: Portal, notebook: Notebook) -> str:
    return f"http://{notebook.host_label}.localhost:{urlsplit(portal.url).port}"


def _cookies_sent(requests_seen: list[Request], host: str) -> list[str]:
    return [r.all_headers().get("cookie", "") for r in requests_seen if urlsplit(r.url).hostname == host]


def test_a_page_a_notebook_serves_reaches_nothing_of_the_portal(page: Page, portal: Portal, people: World) -> None:
    world = people
    instance, notebook = _launch_notebook(world)
    origin = _origin(portal, notebook)
    bobs = Workspace.objects.get(kind=Workspace.Kind.PRIVATE, assigned_user=world.bob).name
    args = {"portal": portal.url, "workspace": bobs}
    root = portal.data_dir / "work" / "team-a" / f"instance-{instance.pk}"
    (root / "notes.html").write_text(ATTACK_PAGE % (ATTACK, json.dumps(args)))
    seen: list[Request] = []
    page.context.on("request", lambda request: seen.append(request))
    portal_answers: list[Any] = []
    page.on("response", lambda r: portal_answers.append(r) if r.url.startswith(portal.url + "/api/") else None)

    # bob signs in to the portal and opens alice's notebook: the portal hands him over.
    sign_in(page, portal, "bob")
    page.goto(f"{origin}/")
    expect(page).to_have_title("JupyterLab")
    assert page.url == f"{origin}/lab"

    # The page alice's notebook serves, as a file (opened from Jupyter's page, as a link there
    # does): it learns nothing, and its POSTs change nothing.
    page.goto(f"{origin}/files/notes.html", referer=f"{origin}/")
    expect(page.locator("body[data-result]")).to_have_count(1, timeout=20_000)
    from_file = json.loads(page.locator("body").get_attribute("data-result") or "{}")
    # Script in the notebook's own pages (a cell's HTML output), without Jupyter's file sandbox.
    page.goto(f"{origin}/")
    in_notebook = page.evaluate(ATTACK, args)
    for result in (from_file, in_notebook):
        assert "sessionid" not in result["cookie"] and "csrftoken" not in result["cookie"], result
        for path in ("/api/v1/workspaces/", "/api/v1/memberships/", f"/w/{bobs}/"):
            assert result[f"read {path}"].startswith("blocked:"), result  # nothing of the portal is readable
        assert result["post"] == "blocked: TypeError", result
    assert not Membership.objects.filter(workspace__name=bobs, user=world.alice).exists()
    # The POSTs the browser did send reached the portal without bob's session, and were refused.
    sent_to_portal = [a for a in portal_answers if a.request.method == "POST"]
    assert sent_to_portal and all(a.status in (401, 403) for a in sent_to_portal), [a.status for a in sent_to_portal]
    # Not one request to the notebook's host carried the portal's cookies.
    for cookie in _cookies_sent(seen, urlsplit(origin).hostname or ""):
        assert "sessionid" not in cookie and "csrftoken" not in cookie, cookie
    assert _cookies_sent(seen, urlsplit(origin).hostname or "")

    # The control: the same script on the portal's own origin acts as bob.
    page.goto(f"{portal.url}/w/{bobs}/")
    on_portal = page.evaluate(ATTACK, args)
    assert "csrftoken" in on_portal["cookie"] and on_portal["read /api/v1/memberships/"].startswith("200"), on_portal
    assert on_portal["post"] == 201, on_portal
    assert Membership.objects.filter(workspace__name=bobs, user=world.alice, role="owner").exists()


def test_a_notebook_host_with_nothing_behind_it_answers_as_one_with_a_notebook(portal: Portal, people: World) -> None:
    """Through the real proxy and the real portal (Daphne, WhiteNoise), static files included."""
    _, notebook = _launch_notebook(people)
    origin = _origin(portal, notebook)
    ghost = origin.replace(notebook.host_label, f"lab-{notebook.pk + 1000}")
    anonymous = browser_session()
    for path in ("/", "/static/favicons/favicon.ico", "/static/web/portal.css", "/api/status", "/api/contents"):
        existing = anonymous.get(origin + path, allow_redirects=False, timeout=10)
        missing = anonymous.get(ghost + path, allow_redirects=False, timeout=10)
        assert existing.status_code == missing.status_code == 302, path
        for answer, label in ((existing, notebook.host_label), (missing, f"lab-{notebook.pk + 1000}")):
            assert answer.headers["Location"] == (
                f"{portal.url}/notebooks/authorize/{label}/?next={path.replace('/', '%2F')}"
            ), path
            assert answer.content == b""
        headers = [{k.lower() for k in a.headers} - {"date", "connection", "keep-alive"} for a in (existing, missing)]
        assert headers[0] == headers[1], path
    # With the server's token the same static file is there: the gate hides something real.
    token = {"Authorization": f"token {notebook.access_token}"}
    assert anonymous.get(f"{origin}/static/favicons/favicon.ico", headers=token, timeout=10).status_code == 200
