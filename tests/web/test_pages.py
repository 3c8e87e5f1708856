"""The user pages: sign-in, the landing page, the switcher, instances, notebooks; access and errors."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from django.test import Client

from apps.audit.models import AuditEvent
from apps.catalog.models import ComputeProfile
from apps.compute.actions import check_launch_instance, check_launch_notebook
from apps.compute.models import Instance, Notebook
from apps.jobs.actions import check_submit_job
from tests.personas import PASSWORD, World
from tests.web.conftest import queries

SignedIn = Callable[[Any], Client]


def test_it_sends_anonymous_visitors_to_sign_in(world: World) -> None:
    response = Client().get("/w/team-a/jobs/")
    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/w/team-a/jobs/"


def test_it_signs_in_with_a_local_account_and_lands_on_the_overview(world: World) -> None:
    client = Client()
    refused = client.post("/login/", {"username": "alice", "password": "wrong"})
    assert refused.status_code == 200
    assert "Please enter a correct username and password" in refused.content.decode()
    response = client.post("/login/", {"username": "alice", "password": PASSWORD}, follow=True)
    assert response.redirect_chain[-1][0] == "/"
    assert "Welcome, alice" in response.content.decode()


def test_it_shows_whats_active_in_my_workspaces_and_nothing_of_others(world: World, signed_in: SignedIn) -> None:
    check_launch_instance(world.team_a, name="alice-box", profile=world.cpu_small, acting_user=world.alice)
    check_launch_instance(world.team_b, name="charlie-box", profile=world.cpu_small, acting_user=world.charlie)
    check_submit_job(
        world.team_a, name="train", command="true", gpu_type="h100", gpus_per_replica=Decimal(1), acting_user=world.bob
    )
    page = signed_in(world.alice).get("/").content.decode()
    assert "alice-box" in page and "train" in page
    assert "charlie-box" not in page
    assert 'data-live-workspaces="alice,team-a"' in page  # the sockets the page opens
    assert "team-a" in page and "0 / 4" in page  # quota meter: nothing admitted yet


def test_the_switcher_lists_my_private_workspace_first_then_my_teams(world: World, signed_in: SignedIn) -> None:
    page = signed_in(world.alice).get("/").content.decode()
    options = [line.strip() for line in page.splitlines() if line.strip().startswith("<option value=")]
    assert [o.split('"')[1] for o in options] == ["alice", "team-a"]
    assert signed_in(world.alice).get("/switch/?workspace=team-a")["Location"] == "/w/team-a/"


def test_another_tenants_workspace_and_objects_are_not_found(world: World, signed_in: SignedIn) -> None:
    instance = check_launch_instance(world.team_b, name="box", profile=world.cpu_small, acting_user=world.charlie)
    alice = signed_in(world.alice)
    for url in (
        "/w/team-b/",
        "/w/team-b/jobs/",
        "/switch/?workspace=team-b",
        f"/w/team-b/instances/{instance.pk}/",
        f"/w/team-a/instances/{instance.pk}/",
        "/w/team-b/usage.json",
    ):
        assert alice.get(url).status_code == 404, url


def test_a_viewer_sees_but_cannot_launch(world: World, signed_in: SignedIn) -> None:
    victor = signed_in(world.victor)
    page = victor.get("/w/team-a/instances/").content.decode()
    assert "Your role in this workspace lets you look, not launch." in page
    assert victor.get("/w/team-a/instances/new/").status_code == 403
    assert victor.post("/w/team-a/jobs/new/", {"name": "x", "command": "true"}).status_code == 403


# --- the launch wizard ------------------------------------------------------------------------


def wizard(client: Client, step: int, goto: int, **values: str) -> Any:
    return client.post("/w/team-a/instances/new/", {"step": step, "goto": goto, **values})


def test_the_wizard_launches_in_three_steps_through_the_action(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    first = alice.get("/w/team-a/instances/new/").content.decode()
    assert 'aria-current="step">Name' in first
    second = wizard(alice, 1, 2, name="dev-box", description="for tests").content.decode()
    assert 'data-profile="gpu-1"' in second and 'data-profile="cpu-small"' in second
    assert "1 × H100" in second and "8 CPU" in second and "64 GB memory" in second
    third = wizard(alice, 2, 3, name="dev-box", description="for tests", profile="gpu-1").content.decode()
    assert 'aria-current="step">Launch' in third and "One H100" not in third and "1 × H100, 8 CPU, 64 GB" in third
    done = wizard(alice, 3, 4, name="dev-box", description="for tests", profile="gpu-1")
    instance = Instance.objects.get(name="dev-box")
    assert done["Location"] == f"/w/team-a/instances/{instance.pk}/"
    assert instance.description == "for tests" and instance.profile == world.gpu_1
    assert AuditEvent.objects.get(action="instance.launch").via == AuditEvent.Via.WEB


def test_the_wizard_shows_refusals_next_to_their_field_and_step(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    bad_name = wizard(alice, 1, 2, name="Bad Name")
    assert bad_name.status_code == 400
    page = bad_name.content.decode()
    assert 'aria-current="step">Name' in page and 'aria-invalid="true"' in page
    assert "Use 1 to 63 lowercase letters" in page
    no_size = wizard(alice, 2, 3, name="box").content.decode()
    assert 'aria-current="step">Size' in no_size and 'id="profile-error"' in no_size
    check_launch_instance(world.team_a, name="taken", profile=world.cpu_small, acting_user=world.bob)
    taken = wizard(alice, 3, 4, name="taken", profile="cpu-small").content.decode()
    assert 'aria-current="step">Name' in taken
    assert "An instance named taken already exists in team-a." in taken


def test_the_wizard_shows_a_limit_above_the_form(world: World, signed_in: SignedIn) -> None:
    for i in range(3):
        check_launch_instance(world.team_a, name=f"box-{i}", profile=world.cpu_small, acting_user=world.bob)
    page = wizard(signed_in(world.alice), 3, 4, name="one-more", profile="cpu-small").content.decode()
    assert 'class="form-error" role="alert"' in page
    assert "Workspace team-a already has 3 instances, its limit" in page


def test_a_profile_appears_in_the_wizard_once_published(world: World, signed_in: SignedIn) -> None:
    draft = ComputeProfile.objects.create(name="gpu-2", gpu_type="h100", gpu_count=Decimal(2), published=False)
    alice = signed_in(world.alice)
    assert 'data-profile="gpu-2"' not in wizard(alice, 1, 2, name="box").content.decode()
    refused = wizard(alice, 3, 4, name="box", profile="gpu-2").content.decode()
    assert "No profile named gpu-2 is available to you." in refused
    draft.published = True
    draft.save()
    assert 'data-profile="gpu-2"' in wizard(alice, 1, 2, name="box").content.decode()


# --- instances and notebooks ------------------------------------------------------------------


def test_the_instance_list_costs_the_same_queries_for_many_rows(world: World, signed_in: SignedIn) -> None:
    world.team_a.max_instances = 40
    world.team_a.save()
    alice = signed_in(world.alice)
    check_launch_instance(world.team_a, name="box-0", profile=world.cpu_small, acting_user=world.alice)
    few = queries(alice, "/w/team-a/instances/")
    for i in range(1, 25):
        check_launch_instance(world.team_a, name=f"box-{i}", profile=world.gpu_1, acting_user=world.alice)
    assert queries(alice, "/w/team-a/instances/") == few
    assert queries(alice, "/") <= 25


def test_the_instance_page_shows_its_metadata_and_deletes_after_confirming(world: World, signed_in: SignedIn) -> None:
    instance = check_launch_instance(world.team_a, name="box", profile=world.gpu_1, acting_user=world.alice)
    alice = signed_in(world.alice)
    page = alice.get(f"/w/team-a/instances/{instance.pk}/").content.decode()
    assert "1 × H100, 8 CPU, 64 GB" in page and "Running for" in page and "by alice" in page
    assert "Download kubeconfig" not in page  # the local backend has none
    confirm = alice.get(f"/w/team-a/instances/{instance.pk}/delete/").content.decode()
    assert "This cannot be undone" in confirm and "irreversible" in confirm
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.QUEUED  # a GET changes nothing
    done = alice.post(f"/w/team-a/instances/{instance.pk}/delete/")
    assert done["Location"] == "/w/team-a/instances/"
    assert Instance.objects.get(pk=instance.pk).state in (Instance.State.DELETING, Instance.State.DELETED)


def test_a_notebook_is_created_on_an_instance_and_listed_as_deploying(world: World, signed_in: SignedIn) -> None:
    instance = check_launch_instance(world.team_a, name="box", profile=world.cpu_small, acting_user=world.alice)
    alice = signed_in(world.alice)
    form = alice.get(f"/w/team-a/notebooks/new/?instance={instance.pk}").content.decode()
    assert f'<option value="{instance.pk}" selected>' in form
    bad = alice.post("/w/team-a/notebooks/new/", {"name": "NB", "profile": "minimal", "instance": instance.pk})
    assert bad.status_code == 400 and "Use 1 to 63 lowercase letters" in bad.content.decode()
    done = alice.post("/w/team-a/notebooks/new/", {"name": "nb", "profile": "minimal", "instance": instance.pk})
    notebook = Notebook.objects.get(name="nb")
    assert done["Location"] == f"/w/team-a/notebooks/{notebook.pk}/"
    listed = alice.get("/w/team-a/notebooks/").content.decode()
    assert 'data-notebook="nb"' in listed and "deploying" in listed
    detail = alice.get(f"/w/team-a/notebooks/{notebook.pk}/").content.decode()
    assert notebook.access_token in detail and f"http://nb-{notebook.pk}.localhost:8000/" in detail  # its own host
    assert (
        notebook.access_token not in signed_in(world.victor).get(f"/w/team-a/notebooks/{notebook.pk}/").content.decode()
    )


def test_a_notebook_refusal_shows_next_to_its_field(world: World, signed_in: SignedIn) -> None:
    instance = check_launch_instance(world.team_a, name="box", profile=world.cpu_small, acting_user=world.alice)
    for i in range(3):
        check_launch_notebook(
            world.team_a, instance=instance, name=f"nb-{i}", profile=world.minimal, acting_user=world.alice
        )
    page = signed_in(world.alice).post(
        "/w/team-a/notebooks/new/", {"name": "nb-9", "profile": "minimal", "instance": instance.pk}
    )
    assert "Workspace team-a already has 3 notebooks, its limit" in page.content.decode()


def test_empty_lists_say_what_to_do_next(world: World, signed_in: SignedIn) -> None:
    alice = signed_in(world.alice)
    assert "Launch one from a size your admin has published" in alice.get("/w/team-a/instances/").content.decode()
    assert "A notebook runs on an instance: launch one first." in alice.get("/w/team-a/notebooks/").content.decode()
    assert "The queue is empty" in alice.get("/w/team-a/jobs/").content.decode()


def test_a_live_update_re_renders_only_the_table(world: World, signed_in: SignedIn) -> None:
    check_launch_instance(world.team_a, name="box", profile=world.cpu_small, acting_user=world.alice)
    part = signed_in(world.alice).get("/w/team-a/instances/?part=table&show=live", headers={"HX-Request": "true"})
    html = part.content.decode()
    # The table's inside only: the element that listens for changes stays on the page (see live.js).
    assert html.lstrip().startswith('<table class="list">') and "<html" not in html and "hx-trigger" not in html
    page = signed_in(world.alice).get("/w/team-a/instances/?show=live").content.decode()
    assert 'id="instance-table"' in page and 'hx-trigger="live-instance from:body' in page
