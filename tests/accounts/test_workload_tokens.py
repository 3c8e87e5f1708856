"""A workload's own token (the GPUPORTAL_TOKEN of a notebook, instance or job) acts for the user
who launched it, in that workload's workspace alone: never in the user's other workspaces, never
on an admin endpoint, only while the workload lives, and only while its user's credentials are the
ones they had when it was made."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from apps.accounts.actions import do_deactivate_user, do_save_user
from apps.accounts.tokens import user_for_token, workload_env, workload_token
from apps.compute.actions import do_delete_instance, do_delete_notebook
from apps.compute.models import Instance, Notebook
from apps.jobs.actions import do_cancel_job
from apps.jobs.models import Job
from apps.workspaces.access import role_in
from apps.workspaces.models import Role, Workspace
from tests.personas import World


def _job(world: World, user: Any, workspace: Workspace, name: str = "train", state: str = Job.State.RUNNING) -> Job:
    """A job as the worker sees it while it runs (the scheduler and backend are not what is tested)."""
    job = Job.objects.create(workspace=workspace, name=name, command="true", created_by=user)
    Job.objects.filter(pk=job.pk).update(state=state)
    return Job.objects.get(pk=job.pk)


def _notebook(world: World, user: Any) -> tuple[Instance, Notebook]:
    instance = Instance.objects.create(workspace=world.team_a, name="box", profile=world.cpu_small, created_by=user)
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.RUNNING, backend_state={})
    notebook = Notebook.objects.create(
        workspace=world.team_a, instance=instance, name="lab", profile=world.minimal, created_by=user
    )
    Notebook.objects.filter(pk=notebook.pk).update(state=Notebook.State.READY, backend_state={})
    return Instance.objects.get(pk=instance.pk), Notebook.objects.get(pk=notebook.pk)


def _as(token: str | None) -> APIClient:
    assert token
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _names(answer: Any) -> list[str]:
    assert answer.status_code == 200, answer.content
    return sorted(item["name"] for item in answer.json()["results"])


def test_it_acts_for_its_launcher_in_its_workspace_and_nowhere_else(world: World) -> None:
    _job(world, world.alice, Workspace.objects.get(name="alice"), name="private")
    job = _job(world, world.alice, world.team_a)
    env = workload_env(job)
    assert env["GPUPORTAL_WORKSPACE"] == "team-a" and env["GPUPORTAL_URL"].startswith("http")
    token = _as(env["GPUPORTAL_TOKEN"])

    me = token.get("/api/v1/me/").json()
    assert (me["username"], me["workspaces"], me["is_staff"]) == ("alice", ["team-a"], False)
    assert _names(token.get("/api/v1/workspaces/")) == ["team-a"]
    assert _names(token.get("/api/v1/jobs/")) == ["train"]
    private = Job.objects.get(name="private")
    assert token.get(f"/api/v1/jobs/{private.pk}/").status_code == 404
    assert token.get("/api/v1/workspaces/alice/").status_code == 404
    assert token.post(f"/api/v1/jobs/{private.pk}/cancel/").status_code == 404

    # It submits in its own workspace, as alice, and nowhere else.
    submitted = token.post("/api/v1/jobs/", {"workspace": "team-a", "name": "next", "command": "true"}, format="json")
    assert submitted.status_code == 201, submitted.content
    assert Job.objects.get(pk=submitted.json()["id"]).created_by == world.alice
    refused = token.post("/api/v1/jobs/", {"workspace": "alice", "name": "sneak", "command": "true"}, format="json")
    assert refused.status_code in (400, 404), refused.content
    assert not Job.objects.filter(name="sneak").exists()

    # The access layer gives it alice's role in team-a and none elsewhere; alice's own token
    # reaches both of her workspaces: the token's scope is what narrows it.
    scoped = user_for_token(env["GPUPORTAL_TOKEN"])
    assert role_in(scoped, world.team_a) == Role.OWNER
    assert role_in(scoped, Workspace.objects.get(name="alice")) is None
    assert role_in(world.alice, Workspace.objects.get(name="alice")) == Role.OWNER
    assert _names(world.client(world.alice).get("/api/v1/workspaces/")) == ["alice", "team-a"]


def test_an_admins_workload_token_is_no_admin(world: World) -> None:
    job = _job(world, world.admin, world.team_a)
    token = _as(workload_token(job))
    for path in ("/api/v1/users/", "/api/v1/groups/"):
        assert token.get(path).status_code == 403, path
        assert world.client(world.admin).get(path).status_code == 200, path  # the admin's own token
    profile = {"name": "sneaky", "cpu_cores": 1, "memory_gb": 1, "published": True}
    assert token.post("/api/v1/compute-profiles/", profile, format="json").status_code == 403
    assert token.patch("/api/v1/users/alice/", {"is_staff": True}, format="json").status_code == 403
    # It acts in the job's workspace (as the owner an admin is everywhere), and only there.
    assert _names(token.get("/api/v1/workspaces/")) == ["team-a"]
    other = _job(world, world.charlie, world.team_b, name="theirs")
    assert token.get(f"/api/v1/jobs/{other.pk}/").status_code == 404
    assert world.client(world.admin).get(f"/api/v1/jobs/{other.pk}/").status_code == 200
    world.admin.refresh_from_db()
    assert world.admin.is_staff  # the scoped view of the admin was never saved


def test_it_stops_working_once_its_workload_ends(world: World) -> None:
    job = _job(world, world.alice, world.team_a)
    instance, notebook = _notebook(world, world.alice)
    tokens = {name: _as(workload_token(row)) for name, row in (("job", job), ("instance", instance), ("nb", notebook))}
    for client in tokens.values():
        assert client.get("/api/v1/me/").status_code == 200

    do_cancel_job(job, acting_user=world.alice)
    assert tokens["job"].get("/api/v1/me/").status_code == 401
    do_delete_notebook(notebook, acting_user=world.alice)
    assert tokens["nb"].get("/api/v1/me/").status_code == 401
    assert tokens["instance"].get("/api/v1/me/").status_code == 200
    do_delete_instance(instance, acting_user=world.alice)
    assert tokens["instance"].get("/api/v1/me/").status_code == 401

    # A job that ran to its end, and one not admitted yet, have no working token either.
    for state in (Job.State.SUCCEEDED, Job.State.FAILED, Job.State.QUEUED):
        ended = _job(world, world.alice, world.team_a, name=f"j-{state.lower()}", state=state)
        assert _as(workload_token(ended)).get("/api/v1/me/").status_code == 401, state


def test_a_forged_or_altered_token_is_refused(world: World, settings: Any) -> None:
    job = _job(world, world.alice, world.team_a)
    other = _job(world, world.alice, world.team_a, name="other")
    token = workload_token(job)
    assert token is not None
    flipped = token[:-1] + ("0" if token[-1] != "0" else "1")
    moved = token.replace(f"_{job.pk}_", f"_{other.pk}_")
    as_instance = token.replace("gpw_job_", "gpw_instance_")
    for forged in (flipped, moved, as_instance, "gpw_job_1_" + "0" * 64, token + "0"):
        assert _as(forged).get("/api/v1/me/").status_code == 401, forged

    # Signed with another secret key: refused, unless that key is one the portal still accepts.
    old = settings.SECRET_KEY
    settings.SECRET_KEY = "another-secret-key-" + "x" * 40
    assert _as(token).get("/api/v1/me/").status_code == 401
    settings.SECRET_KEY_FALLBACKS = [old]
    assert _as(token).get("/api/v1/me/").status_code == 200


def test_it_acts_no_further_than_its_user_may(world: World) -> None:
    job = _job(world, world.bob, world.team_a)  # bob is in team A through its group
    token = _as(workload_token(job))
    assert _names(token.get("/api/v1/jobs/")) == ["train"]
    world.bob.groups.remove(Group.objects.get(name="team-a"))
    assert token.get("/api/v1/jobs/").json()["count"] == 0
    assert token.get(f"/api/v1/jobs/{job.pk}/").status_code == 404
    world.bob.is_active = False
    world.bob.save()
    assert token.get("/api/v1/me/").status_code == 401


def test_no_answer_shows_a_workloads_token(world: World) -> None:
    job = _job(world, world.alice, world.team_a)
    instance, notebook = _notebook(world, world.alice)
    alice = world.client(world.alice)
    for row, path in ((job, "jobs"), (instance, "instances"), (notebook, "notebooks")):
        token = workload_token(row)
        assert token
        for answer in (alice.get(f"/api/v1/{path}/"), alice.get(f"/api/v1/{path}/{row.pk}/")):
            assert answer.status_code == 200 and token not in answer.content.decode()
    # A workload launched by nobody (a user since removed) gets the portal's address, and no token.
    orphan = Job.objects.create(workspace=world.team_a, name="orphan", command="true", gpus_per_replica=Decimal(0))
    assert "GPUPORTAL_TOKEN" not in workload_env(orphan) and "GPUPORTAL_URL" in workload_env(orphan)


@pytest.mark.parametrize("change", ["password", "single sign-on", "deactivation"])
def test_it_stops_working_once_its_users_credentials_change(world: World, change: str) -> None:
    """A running job's, instance's and notebook's tokens end with the next request after their
    user's password changes, single sign-on ends their access (an unusable password) or they are
    deactivated: a token someone copied out of a workload is no way around that."""
    job = _job(world, world.alice, world.team_a)
    instance, notebook = _notebook(world, world.alice)
    tokens = [workload_token(row) or "" for row in (job, instance, notebook)]
    bobs = _as(workload_token(_job(world, world.bob, world.team_a, name="bobs")))
    for token in tokens:
        assert _as(token).get("/api/v1/me/").status_code == 200

    if change == "password":
        do_save_user(world.alice, password="another-horse-battery-staple", acting_user=world.alice)
    elif change == "single sign-on":
        world.alice.set_unusable_password()
        world.alice.save(update_fields=["password"])
    else:
        do_deactivate_user(world.alice, acting_user=world.admin)

    for token in tokens:
        assert user_for_token(token) is None, change
        assert _as(token).get("/api/v1/me/").status_code == 401, change
    assert bobs.get("/api/v1/me/").status_code == 200  # another user's workloads are untouched
    if change != "deactivation":  # started again, the workload is handed a token that works
        job.created_by.refresh_from_db()
        assert _as(workload_token(job)).get("/api/v1/me/").status_code == 200
