"""An instance's pages, the generic ones (apps/web/generic.py): the list's tabs, the page's live part
and its actions for each role, and the delete confirmation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.test import Client

from apps.compute.actions import check_launch_instance, check_launch_notebook
from apps.compute.models import Instance
from tests.personas import World

SignedIn = Callable[[Any], Client]
LIVE = {"HX-Request": "true"}


def launch(world: World, name: str = "box") -> Instance:
    return check_launch_instance(world.team_a, name=name, profile=world.cpu_small, acting_user=world.alice)


def test_the_list_shows_live_instances_and_all_on_its_second_tab(world: World, signed_in: SignedIn) -> None:
    launch(world, "kept")
    gone = launch(world, "gone")
    Instance.objects.filter(pk=gone.pk).update(state=Instance.State.DELETED)
    alice = signed_in(world.alice)
    live = alice.get("/w/team-a/instances/").content.decode()
    assert 'data-instance="kept"' in live and 'data-instance="gone"' not in live
    assert 'href="?show=all"' in live  # the tab's address is the one the page always had
    every = alice.get("/w/team-a/instances/?show=all").content.decode()
    assert 'data-instance="kept"' in every and 'data-instance="gone"' in every
    assert 'hx-get="/w/team-a/instances/?part=table&show=all&page=1"' in every  # a live update keeps the tab
    part = alice.get("/w/team-a/instances/?part=table&show=live", headers=LIVE).content.decode()
    assert 'data-instance="kept"' in part and 'data-instance="gone"' not in part


def test_a_live_update_renders_the_status_the_notebooks_and_the_actions_that_still_apply(
    world: World, signed_in: SignedIn
) -> None:
    box = launch(world)
    check_launch_notebook(world.team_a, instance=box, name="lab", profile=world.minimal, acting_user=world.alice)
    alice = signed_in(world.alice)
    url = f"/w/team-a/instances/{box.pk}/?part=status"
    part = alice.get(url, headers=LIVE).content.decode()
    assert 'id="instance-status"' in part and 'id="instance-state"' in part and ">lab</a>" in part
    assert '<div id="instance-actions" class="actions" hx-swap-oob="true">' in part
    assert "New notebook on it" in part and "Delete…" in part
    assert "<html" not in part and 'id="collaborators"' not in part  # the live part alone
    Instance.objects.filter(pk=box.pk).update(state=Instance.State.DELETED)
    deleted = alice.get(url, headers=LIVE).content.decode()
    assert 'data-state="DELETED"' in deleted
    assert "New notebook on it" not in deleted and "Delete…" not in deleted


def test_a_viewer_sees_the_instance_and_is_offered_no_change(world: World, signed_in: SignedIn) -> None:
    box = launch(world)
    page = signed_in(world.victor).get(f"/w/team-a/instances/{box.pk}/").content.decode()
    assert "cpu-small" in page and 'id="collaborators"' in page  # a member sees who it is shared with
    for offer in ("New notebook on it", "Delete…", "Save description", ">Invite<", "New notebook</a>"):
        assert offer not in page, offer
    alice = signed_in(world.alice).get(f"/w/team-a/instances/{box.pk}/").content.decode()
    for offer in ("New notebook on it", "Delete…", "Save description", ">Invite<"):
        assert offer in alice, offer


def test_deleting_asks_first_and_says_why_it_cannot(world: World, signed_in: SignedIn) -> None:
    box = launch(world)
    check_launch_notebook(world.team_a, instance=box, name="lab", profile=world.minimal, acting_user=world.alice)
    alice = signed_in(world.alice)
    url = f"/w/team-a/instances/{box.pk}/delete/"
    confirm = alice.get(url).content.decode()
    assert "Delete instance box?" in confirm and "Deleting <strong>box</strong> releases its GPUs" in confirm
    assert "and stops its 1 notebook." in confirm and ">Delete permanently</button>" in confirm
    assert alice.post(url)["Location"] == "/w/team-a/instances/"
    again = alice.post(url)
    assert again.status_code == 409 and "Instance box is already deleted." in again.content.decode()
    assert signed_in(world.victor).get(url).status_code == 403
    assert signed_in(world.charlie).get(url).status_code == 404
