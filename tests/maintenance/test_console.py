"""The console's node maintenance page: buttons that cordon, drain and bring back a node, a form
that announces a window (bad input shown at its field), for admins only; and how it looks at a
desktop's and a phone's width, with the banner on an affected user's page (tests/look.py)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.inventory.maintenance import check_save_window, do_cordon_node
from apps.inventory.models import Cluster, MaintenanceWindow, Node
from apps.jobs.actions import check_submit_job
from apps.scheduling.adapter import run_cycle
from tests.look import look_at
from tests.personas import World, make_world


def test_an_admin_cordons_drains_and_brings_back_a_node(world: World, client: Any) -> None:
    client.force_login(world.admin)
    node = Node.objects.get()

    page = client.get("/console/maintenance/")
    cordoned = client.post(f"/console/maintenance/nodes/{node.pk}/cordon/", {"reason": "fans"}, follow=True)
    node.refresh_from_db()
    assert page.status_code == 200 and node.name in page.content.decode()
    assert node.maintenance == "cordoned" and "is cordoned" in cordoned.content.decode()
    client.post(f"/console/maintenance/nodes/{node.pk}/drain/", {"reason": "fans"})
    node.refresh_from_db()
    assert node.maintenance == "drained"
    client.post(f"/console/maintenance/nodes/{node.pk}/uncordon/")
    node.refresh_from_db()
    assert node.maintenance == ""
    assert client.post(f"/console/maintenance/nodes/{node.pk}/explode/").status_code == 404


def test_the_window_form_shows_bad_input_at_its_field(world: World, client: Any) -> None:
    client.force_login(world.admin)
    start = timezone.now() + timedelta(hours=1)

    begin, end = f"{start:%Y-%m-%dT%H:%M}", f"{start + timedelta(hours=1):%Y-%m-%dT%H:%M}"

    refused = client.post("/console/maintenance/windows/",
                          {"cluster": "local", "start_at": begin, "end_at": begin, "reason": "BIOS"})  # fmt: skip
    node = Node.objects.get().name
    body = {"cluster": "local", "start_at": begin, "end_at": end, "reason": "BIOS", "nodes": [node]}
    made = client.post("/console/maintenance/windows/", body)

    assert refused.status_code == 400 and "must end after it starts" in refused.content.decode()
    assert made.status_code == 302
    window = MaintenanceWindow.objects.get()
    assert (window.reason, [n.name for n in window.nodes.all()]) == ("BIOS", [Node.objects.get().name])


@pytest.mark.parametrize("persona", ["alice", "charlie"])
def test_members_are_refused_the_page_and_its_buttons(world: World, client: Any, persona: str) -> None:
    client.force_login(getattr(world, persona))
    node = Node.objects.get()

    assert client.get("/console/maintenance/").status_code == 403
    assert client.post(f"/console/maintenance/nodes/{node.pk}/cordon/").status_code == 403
    node.refresh_from_db()
    assert node.maintenance == ""


@pytest.mark.slow
def test_the_maintenance_pages_look_right_at_both_widths(
    transactional_db: None, live_server: Any, settings: Any
) -> None:
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    world = make_world()
    check_submit_job(world.team_a, name="train", command="sleep 100", gpu_type="h100",
                     gpus_per_replica=Decimal("1"), acting_user=world.alice)  # fmt: skip
    run_cycle()
    start = timezone.now() + timedelta(hours=2)
    check_save_window(MaintenanceWindow(), {"cluster": Cluster.objects.get(name="local"), "start_at": start,
                      "end_at": start + timedelta(hours=3), "reason": "Power supply replaced"},
                      acting_user=world.admin)  # fmt: skip
    do_cordon_node(Node.objects.get(), reason="Fan noise", acting_user=world.admin)

    seen = look_at(live_server.url, [
        (world.admin, "/console/maintenance/", "console-maintenance"),
        (world.alice, "/w/team-a/", "maintenance-banner"),
    ])  # fmt: skip

    for (name, width), (status, styled, fits, stacked) in seen.items():
        assert status == 200, name
        assert styled, f"{name}: the stylesheet is not applied"
        assert fits, f"{name} scrolls sideways at {width} px"
        if name == "console-maintenance":
            assert stacked == (width == "390"), f"{name} at {width} px"
