"""A notebook's pages, the generic ones (apps/web/generic.py): the list's tabs, the page's live part
and the buttons in it, and the delete confirmation, for a member and for a collaborator."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.test import Client

from apps.compute.actions import check_launch_instance, check_launch_notebook, do_cull_notebook, do_delete_notebook
from apps.compute.models import Notebook
from tests.api.test_collaborators import Shared
from tests.personas import World
from tests.web.conftest import queries

SignedIn = Callable[[Any], Client]
LIVE = {"HX-Request": "true"}


def notebook(world: World, name: str = "lab", host: str = "box") -> Notebook:
    instance = check_launch_instance(world.team_a, name=host, profile=world.cpu_small, acting_user=world.alice)
    return check_launch_notebook(world.team_a, instance=instance, name=name, profile=world.minimal,
                                 acting_user=world.alice)  # fmt: skip


def test_the_live_tab_keeps_what_the_portal_stopped_and_all_shows_the_rest(world: World, signed_in: SignedIn) -> None:
    culled = notebook(world, "culled", "box-1")
    do_cull_notebook(culled, "culled: idle for 2 h")
    deleted = notebook(world, "deleted", "box-2")
    do_delete_notebook(deleted, acting_user=world.alice)
    alice = signed_in(world.alice)
    live = alice.get("/w/team-a/notebooks/").content.decode()
    assert 'data-notebook="culled"' in live and 'data-notebook="deleted"' not in live  # it can start again
    every = alice.get("/w/team-a/notebooks/?show=all").content.decode()
    assert 'data-notebook="culled"' in every and 'data-notebook="deleted"' in every
    assert '<span class="visually-hidden">Open</span></th>' in every  # the buttons' column, named for screen readers


def test_the_notebook_list_costs_the_same_queries_for_many_rows(world: World, signed_in: SignedIn) -> None:
    world.team_a.max_notebooks = 40
    world.team_a.save()
    alice = signed_in(world.alice)
    box = notebook(world, "nb-0").instance
    few = queries(alice, "/w/team-a/notebooks/?show=all")
    for i in range(1, 12):
        check_launch_notebook(world.team_a, instance=box, name=f"nb-{i}", profile=world.minimal,
                              acting_user=world.bob)  # fmt: skip
    assert queries(alice, "/w/team-a/notebooks/?show=all") == few


def test_a_stopped_notebook_starts_again_from_its_page(world: World) -> None:
    """The button sits in the page's live part, rendered from the kind's description: its form
    carries the page's CSRF token, as every form of the portal does."""
    lab = notebook(world)
    do_cull_notebook(lab, "culled: idle for 2 h")
    alice = Client(enforce_csrf_checks=True)
    alice.force_login(world.alice)
    for page in (
        alice.get(f"/w/team-a/notebooks/{lab.pk}/").content.decode(),
        alice.get(f"/w/team-a/notebooks/{lab.pk}/?part=status", headers=LIVE).content.decode(),
    ):
        form = re.search(rf'<form method="post" action="/w/team-a/notebooks/{lab.pk}/start/">(.*?)</form>', page, re.S)
        assert form and "Start again" in form.group(1)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.group(1))
        assert token, form.group(1)
    response = alice.post(f"/w/team-a/notebooks/{lab.pk}/start/", {"csrfmiddlewaretoken": token.group(1)})
    assert response.status_code == 302
    lab.refresh_from_db()
    assert lab.state == Notebook.State.PENDING


def test_a_live_update_renders_the_status_and_the_actions_that_still_apply(world: World, signed_in: SignedIn) -> None:
    shared = Shared(world)
    url = f"/w/team-a/notebooks/{shared.notebook.pk}/?part=status"
    for user, may_use in ((world.alice, True), (shared.wendy, True), (shared.rita, False)):
        part = signed_in(user).get(url, headers=LIVE).content.decode()
        assert 'id="notebook-status"' in part and "<html" not in part
        assert '<div id="notebook-actions" class="actions" hx-swap-oob="true">' in part
        assert ("Delete…" in part) is may_use, user
        assert (shared.notebook.access_token in part) is may_use, user
    do_delete_notebook(shared.notebook, acting_user=world.alice)
    stopped = signed_in(world.alice).get(url, headers=LIVE).content.decode()
    assert 'data-state="STOPPED"' in stopped and "Delete…" not in stopped


def test_deleting_asks_first_and_sends_a_collaborator_back_to_the_instance(world: World, signed_in: SignedIn) -> None:
    shared = Shared(world)
    url = f"/w/team-a/notebooks/{shared.notebook.pk}/delete/"
    wendy = signed_in(shared.wendy)
    confirm = wendy.get(url).content.decode()
    assert "Delete notebook shared-nb?" in confirm and "on instance shared." in confirm
    # Her crumbs lead to the instance shared with her, not to the workspace's list (a 404 for her).
    assert f'Shared with you · <a href="/w/team-a/instances/{shared.instance.pk}/">shared</a>' in confirm
    assert 'href="/w/team-a/notebooks/"' not in confirm.split("<main", 1)[1]
    assert signed_in(shared.rita).get(url).status_code == 403
    assert signed_in(world.charlie).get(url).status_code == 404
    assert wendy.post(url)["Location"] == f"/w/team-a/instances/{shared.instance.pk}/"
    again = signed_in(world.alice).post(url)
    assert again.status_code == 409 and "Notebook shared-nb is already stopped." in again.content.decode()


def test_the_starting_message_goes_once_the_notebook_is_no_longer_starting(world: World, signed_in: SignedIn) -> None:
    """The page updates itself: a flash that announced a state ("is starting") is emptied by the first
    live update that renders another state, and kept by those that render the same one."""
    box = check_launch_instance(world.team_a, name="box", profile=world.cpu_small, acting_user=world.alice)
    alice = signed_in(world.alice)
    response = alice.post("/w/team-a/notebooks/new/", {"name": "lab", "profile": "minimal", "instance": box.pk},
                          follow=True)  # fmt: skip
    page = response.content.decode()
    lab = Notebook.objects.get(name="lab")
    assert "Notebook lab is starting." in page
    assert f'hx-get="/w/team-a/notebooks/{lab.pk}/?part=status&amp;shown={lab.state}"' in page
    url = f"/w/team-a/notebooks/{lab.pk}/?part=status&shown={lab.state}"
    still = alice.get(url, headers=LIVE).content.decode()
    assert 'id="flash"' not in still  # the state it announced holds: the message stays
    Notebook.objects.filter(pk=lab.pk).update(state=Notebook.State.READY)
    ready = alice.get(url, headers=LIVE).content.decode()
    assert '<div class="flash" id="flash" role="status" hx-swap-oob="true"></div>' in ready
    seen_ready = alice.get(url.replace(f"shown={lab.state}", "shown=READY"), headers=LIVE).content.decode()
    assert 'id="flash"' not in seen_ready  # a page rendered once it was ready keeps its messages
