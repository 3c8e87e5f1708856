"""Maintenance windows: announced by mail to the users whose work they affect (and no one else),
shown on those users' pages, their nodes drained at the start and back at the end."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.inventory.maintenance import upkeep
from apps.inventory.models import Cluster, MaintenanceWindow, Node
from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from apps.scheduling.adapter import run_cycle
from tests.mail import body_of, smtp_server
from tests.personas import World


def submit(world: World, workspace: Any, user: Any, name: str, **kwargs: Any) -> Job:
    kwargs = {"gpu_type": "h100", "gpus_per_replica": Decimal("1"), **kwargs}
    job = check_submit_job(workspace, name=name, command="sleep 100", acting_user=user, **kwargs)
    run_cycle()
    job.refresh_from_db()
    return job


def announce(world: World, captured: Any, **body: Any) -> Any:
    start = timezone.now() + timedelta(hours=1)
    body = {"cluster": "local", "start_at": start.isoformat(), "end_at": (start + timedelta(hours=2)).isoformat(),
            "reason": "New power supply", **body}  # fmt: skip
    with captured(execute=True):
        return world.client(world.admin).post("/api/v1/maintenance-windows/", body, format="json")


def test_it_mails_the_users_whose_work_it_affects_and_no_one_else(
    world: World, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    running = submit(world, world.team_a, world.alice, "train")
    # team-b's work holds no GPU: the window does not affect it.
    submit(world, world.team_b, world.charlie, "secret-project", gpus_per_replica=Decimal("0"))
    with smtp_server() as box:
        for key, value in box.settings().items():
            setattr(settings, key, value)
        response = announce(world, django_capture_on_commit_callbacks)
        [mail] = box.wait_for(1)

    assert response.status_code == 201, response.json()
    assert response.json()["state"] == "scheduled" and response.json()["workspaces"] == ["team-a"]
    assert mail["To"] == "alice@example.org" and "Maintenance of local" in mail["Subject"]
    text = body_of(mail)
    assert f"job train #{running.pk} in workspace team-a" in text and "requeued elsewhere" in text
    assert "New power supply" in text and "secret-project" not in text and "team-b" not in text
    assert AuditEvent.objects.filter(action="maintenance.create").count() == 1


def test_queued_work_that_may_be_placed_there_is_affected_too(
    world: World, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    submit(world, world.team_a, world.alice, "full", gpus_per_replica=Decimal("4"))  # team-a's quota
    waiting = submit(world, world.team_a, world.bob, "waits")
    submit(world, world.team_b, world.charlie, "fill-b")
    assert waiting.state == Job.State.QUEUED
    with smtp_server() as box:
        for key, value in box.settings().items():
            setattr(settings, key, value)
        announce(world, django_capture_on_commit_callbacks)
        mails = box.wait_for(3)

    by_user = {m["To"]: body_of(m) for m in mails}
    assert set(by_user) == {"alice@example.org", "bob@example.org", "charlie@example.org"}
    assert "waits" in by_user["bob@example.org"] and "not placed on these nodes" in by_user["bob@example.org"]
    assert "fill-b" not in by_user["bob@example.org"] and "full" not in by_user["bob@example.org"]
    assert "team-a" not in by_user["charlie@example.org"] and "fill-b" in by_user["charlie@example.org"]


def test_its_users_pages_show_it_and_others_do_not(world: World, client: Any) -> None:
    submit(world, world.team_a, world.alice, "train")
    announce(world, lambda execute: _Nothing())

    client.force_login(world.bob)
    shown = client.get(f"/w/{world.team_a.name}/").content.decode()
    client.force_login(world.charlie)
    hidden = client.get(f"/w/{world.team_b.name}/").content.decode()

    assert "Maintenance of cluster local" in shown and "New power supply" in shown
    assert "Maintenance of cluster local" not in hidden


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: Any) -> None:
        return None


def test_its_nodes_are_drained_at_the_start_and_back_at_the_end(
    world: World, django_capture_on_commit_callbacks: Any
) -> None:
    job = submit(world, world.team_a, world.alice, "train")
    window_id = announce(world, django_capture_on_commit_callbacks, nodes=[Node.objects.get().name]).json()["id"]
    window = MaintenanceWindow.objects.get(pk=window_id)

    upkeep(window.start_at + timedelta(seconds=1))

    job.refresh_from_db()
    node = Node.objects.get()
    assert window.__class__.objects.get(pk=window_id).state == "active"
    assert (node.maintenance, node.maintenance_window_id) == ("drained", window_id)  # admitted, not started
    assert job.state == Job.State.QUEUED

    upkeep(window.end_at + timedelta(seconds=1))

    node.refresh_from_db()
    assert node.maintenance == "" and MaintenanceWindow.objects.get(pk=window_id).state == "ended"
    run_cycle()
    job.refresh_from_db()
    assert job.state == Job.State.ADMITTED
    assert [a for a in AuditEvent.objects.order_by("pk").values_list("action", flat=True) if "." in a and
            a.split(".")[0] in ("maintenance", "node")] == [
        "maintenance.create", "maintenance.start", "node.drain", "node.drained", "node.uncordon", "maintenance.end"
    ]  # fmt: skip


def test_bad_windows_are_refused_with_field_messages(world: World, django_capture_on_commit_callbacks: Any) -> None:
    past = timezone.now() - timedelta(hours=3)
    Cluster.objects.create(name="other", kind="slurm")

    backwards = announce(world, django_capture_on_commit_callbacks, end_at=past.isoformat())
    stranger = announce(world, django_capture_on_commit_callbacks, nodes=["no-such-node"])
    silent = announce(world, django_capture_on_commit_callbacks, reason="  ")
    elsewhere = announce(world, django_capture_on_commit_callbacks, cluster="other", nodes=[Node.objects.get().name])

    assert [r.status_code for r in (backwards, stranger, silent, elsewhere)] == [400] * 4
    assert list(backwards.json()["error"]["fields"]) == ["end_at"]
    assert list(stranger.json()["error"]["fields"]) == ["nodes"]
    assert list(silent.json()["error"]["fields"]) == ["reason"]
    assert list(elsewhere.json()["error"]["fields"]) == ["nodes"]
    assert not MaintenanceWindow.objects.exists()


def test_members_cannot_see_or_make_windows(world: World, django_capture_on_commit_callbacks: Any) -> None:
    window_id = announce(world, django_capture_on_commit_callbacks).json()["id"]

    for persona in ("alice", "charlie"):
        client = world.client(getattr(world, persona))
        assert client.get(f"/api/v1/maintenance-windows/{window_id}/").status_code == 403
        assert client.delete(f"/api/v1/maintenance-windows/{window_id}/").status_code == 403
    assert MaintenanceWindow.objects.filter(pk=window_id).exists()


def test_withdrawing_a_window_under_way_brings_its_nodes_back(
    world: World, django_capture_on_commit_callbacks: Any
) -> None:
    window_id = announce(world, django_capture_on_commit_callbacks).json()["id"]
    upkeep(MaintenanceWindow.objects.get(pk=window_id).start_at + timedelta(seconds=1))
    assert Node.objects.get().maintenance == "drained"

    response = world.client(world.admin).delete(f"/api/v1/maintenance-windows/{window_id}/")

    assert response.status_code == 204
    assert Node.objects.get().maintenance == "" and not MaintenanceWindow.objects.exists()


def test_a_new_time_is_mailed_again_and_a_window_under_way_keeps_its_start(
    world: World, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    submit(world, world.team_a, world.alice, "train")
    admin = world.client(world.admin)
    with smtp_server() as box:
        for key, value in box.settings().items():
            setattr(settings, key, value)
        window = announce(world, django_capture_on_commit_callbacks).json()
        later = timezone.now() + timedelta(hours=5)
        with django_capture_on_commit_callbacks(execute=True):
            moved = admin.patch(f"/api/v1/maintenance-windows/{window['id']}/",
                                {"start_at": later.isoformat(), "end_at": (later + timedelta(hours=1)).isoformat()},
                                format="json")  # fmt: skip
            reworded = admin.patch(f"/api/v1/maintenance-windows/{window['id']}/", {"reason": "PSU"}, format="json")
        first, second = box.wait_for(2)

    assert moved.status_code == reworded.status_code == 200
    assert second["Subject"].startswith("Changed: maintenance of local") and "PSU" not in body_of(second)
    assert len(box.received) == 2  # a new reason alone is not mailed
    started = MaintenanceWindow.objects.get(pk=window["id"])
    upkeep(started.start_at + timedelta(seconds=1))
    refused = admin.patch(f"/api/v1/maintenance-windows/{window['id']}/", {"start_at": later.isoformat()},
                          format="json")  # fmt: skip
    longer = admin.patch(f"/api/v1/maintenance-windows/{window['id']}/",
                         {"end_at": (later + timedelta(hours=3)).isoformat()}, format="json")  # fmt: skip
    assert refused.status_code == 409 and longer.status_code == 200 and longer.json()["state"] == "active"


def test_members_see_a_node_cordoned_but_not_by_whom(world: World) -> None:
    node = Node.objects.get()
    world.client(world.admin).post(f"/api/v1/nodes/{node.pk}/cordon/", {"reason": "fans"}, format="json")

    shown = world.client(world.charlie).get(f"/api/v1/nodes/{node.pk}/").json()

    assert (shown["maintenance"], shown["cordoned_by"]) == ("cordoned", None)
    assert world.client(world.admin).get(f"/api/v1/nodes/{node.pk}/").json()["cordoned_by"] == "admin"
