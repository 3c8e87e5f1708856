"""Idle culling and maximum runtime: a real notebook (Jupyter on the local backend) that runs a
cell is not idle however long the cell; left idle, its user is mailed (through a real SMTP server)
and, the warning's time later, it is stopped, saying why, and starts again at a click. Workloads
past their workspace's maximum runtime are ended, saying why."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import websocket
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.catalog.models import NotebookProfile
from apps.compute.culling import cull, duration, last_activity
from apps.compute.models import Instance, Notebook
from apps.workloads.host import reconcile
from apps.workspaces.models import Workspace
from tests.compute.test_local_notebooks import _launch
from tests.mail import Mailbox, body_of, smtp_server
from tests.personas import World
from tests.proxy import Proxy, browser_session, loopback_ws_options

LIMIT_S, WARNING_S = 8, 4


@pytest.fixture
def jupyter_profile(tx_world: World) -> NotebookProfile:
    """A profile of just the Jupyter server and a kernel (the environment is built once, cached)."""
    return NotebookProfile.objects.create(name="kernel-only", image="quay.io/jupyter/base-notebook", published=True)


@pytest.fixture
def mailbox(settings: Any) -> Iterator[Mailbox]:
    with smtp_server() as box:
        for name, value in box.settings().items():
            setattr(settings, name, value)
        yield box


def _start_cell(notebook: Notebook, code: str) -> websocket.WebSocket:
    """Start `code` in a new kernel of the notebook, with its token, and leave it running."""
    token = {"Authorization": f"token {notebook.access_token}"}
    kernel = browser_session().post(f"{notebook.url}api/kernels", headers=token, json={"name": "python3"}, timeout=30)
    assert kernel.status_code == 201, kernel.text
    address, options = loopback_ws_options(
        notebook.url.replace("http://", "ws://") + f"api/kernels/{kernel.json()['id']}/channels"
    )
    sock = websocket.create_connection(
        address, header=[f"Authorization: token {notebook.access_token}"], timeout=30, **options
    )
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": msg_id, "version": "5.3"}
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
    sock.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                          "content": content}))  # fmt: skip
    return sock


def _kernels_busy(notebook: Notebook) -> bool:
    token = {"Authorization": f"token {notebook.access_token}"}
    kernels = browser_session().get(f"{notebook.url}api/kernels", headers=token, timeout=10).json()
    return any(k["execution_state"] == "busy" for k in kernels)


def test_an_idle_notebook_is_warned_then_stopped_a_busy_one_is_not_and_it_starts_again(
    proxy: Proxy, tx_world: World, jupyter_profile: NotebookProfile, mailbox: Mailbox, settings: Any
) -> None:
    settings.PORTAL_CULL_WARNING_S = WARNING_S
    Workspace.objects.filter(pk=tx_world.team_a.pk).update(max_idle_s=LIMIT_S)
    _instance, notebook = _launch(tx_world, jupyter_profile)

    # A cell that runs longer than the limit: never idle while it runs.
    sock = _start_cell(notebook, "import time; time.sleep(14)")
    try:
        deadline = time.monotonic() + 8
        while not _kernels_busy(notebook):
            assert time.monotonic() < deadline, "the cell never ran"
            time.sleep(0.2)
        started = time.monotonic()
        while time.monotonic() - started < LIMIT_S + 2:
            assert cull() == {"idle_warned": 0, "idle_culled": 0, "runtime_culled": 0}
            time.sleep(1)
        assert mailbox.received == [] and Notebook.objects.get(pk=notebook.pk).state == Notebook.State.READY
        while _kernels_busy(notebook):
            time.sleep(0.5)
    finally:
        sock.close()

    # Idle from now: first the warning, and only the warning's time later, the stop.
    deadline = time.monotonic() + 30
    while not Notebook.objects.get(pk=notebook.pk).idle_warned_at:
        assert time.monotonic() < deadline, "no warning"
        cull()
        time.sleep(0.5)
    [mail] = mailbox.wait_for(1)
    assert mail["To"] == "alice@example.org"
    assert re.fullmatch(r"Notebook lab will be stopped in \d+ s: it is idle", mail["Subject"]), mail["Subject"]
    assert f"/w/team-a/notebooks/{notebook.pk}/" in body_of(mail)
    said = " ".join(body_of(mail).split())
    assert "GPUs back" in said and "giving its GPUs back" not in said  # a notebook holds none of its own
    assert f"Stopping it gives no GPUs back: they stay with its instance {notebook.instance.name} until" in said
    assert Notebook.objects.get(pk=notebook.pk).state == Notebook.State.READY
    while Notebook.objects.get(pk=notebook.pk).state == Notebook.State.READY:
        assert time.monotonic() < deadline, "not stopped"
        cull()
        time.sleep(0.5)
    reconcile(sweep=False)  # the stop, as the scheduler loop does it
    stopped = Notebook.objects.get(pk=notebook.pk)
    assert stopped.state == Notebook.State.STOPPED
    assert re.fullmatch(r"culled: idle for \d+ s", stopped.stop_reason), stopped.stop_reason
    actions = list(AuditEvent.objects.filter(target_id=str(notebook.pk), target_type="compute.notebook")
                   .order_by("id").values_list("action", flat=True))  # fmt: skip
    assert actions.index("notebook.idle_warning") < actions.index("notebook.cull")
    assert len(mailbox.received) == 1  # warned once

    # Its page says why, and starts it again; at the same address, answering again.
    page = tx_world.client(tx_world.alice).get(f"/api/v1/notebooks/{notebook.pk}/").json()
    assert page["state"] == "STOPPED" and page["stop_reason"] == stopped.stop_reason
    again = tx_world.client(tx_world.alice).post(f"/api/v1/notebooks/{notebook.pk}/start/")
    assert again.status_code == 200, again.content
    deadline = time.monotonic() + 60
    while Notebook.objects.get(pk=notebook.pk).state != Notebook.State.READY:
        assert time.monotonic() < deadline, Notebook.objects.get(pk=notebook.pk).failure_reason
        reconcile(sweep=False)
        time.sleep(0.5)
    restarted = Notebook.objects.get(pk=notebook.pk)
    assert restarted.stop_reason == "" and restarted.idle_warned_at is None and restarted.url == notebook.url
    status = browser_session().get(
        f"{notebook.url}api/status", headers={"Authorization": f"token {notebook.access_token}"}, timeout=10
    )
    assert status.status_code == 200


def test_a_server_that_cannot_be_asked_is_not_judged_idle(world: World) -> None:
    from apps.compute.actions import check_launch_instance, check_launch_notebook

    box = check_launch_instance(world.team_a, name="box", profile=world.cpu_small, acting_user=world.alice)
    notebook = check_launch_notebook(
        world.team_a, instance=box, name="lab", profile=world.minimal, acting_user=world.alice
    )
    Notebook.objects.filter(pk=notebook.pk).update(
        state=Notebook.State.READY, proxy_target="http://127.0.0.1:9", started_at=timezone.now() - timedelta(days=1)
    )
    Workspace.objects.filter(pk=world.team_a.pk).update(max_idle_s=60)
    notebook.refresh_from_db()
    assert last_activity(notebook, timezone.now()) is None
    assert cull()["idle_warned"] == 0
    assert Notebook.objects.get(pk=notebook.pk).state == Notebook.State.READY


def test_workloads_past_the_workspaces_maximum_runtime_are_ended_saying_why(world: World) -> None:
    from apps.compute.actions import check_launch_instance, check_launch_notebook

    long_ago = timezone.now() - timedelta(hours=2, minutes=10)
    old = check_launch_instance(world.team_a, name="old", profile=world.cpu_small, acting_user=world.alice)
    young = check_launch_instance(world.team_a, name="young", profile=world.cpu_small, acting_user=world.alice)
    notebook = check_launch_notebook(
        world.team_a, instance=young, name="lab", profile=world.minimal, acting_user=world.alice
    )
    Instance.objects.filter(pk=old.pk).update(state=Instance.State.RUNNING, started_at=long_ago)
    Instance.objects.filter(pk=young.pk).update(state=Instance.State.RUNNING, started_at=timezone.now())
    Notebook.objects.filter(pk=notebook.pk).update(state=Notebook.State.READY, started_at=long_ago)
    Workspace.objects.filter(pk=world.team_a.pk).update(max_runtime_s=3600)
    assert cull()["runtime_culled"] == 2
    old.refresh_from_db()
    notebook.refresh_from_db()
    assert old.state in (Instance.State.DELETING, Instance.State.DELETED)
    assert old.stop_reason == "stopped: ran for 2 h 10 min, past workspace team-a's limit of 1 h"
    assert notebook.state == Notebook.State.STOPPED and notebook.stop_reason.startswith("stopped: ran for 2 h 10 min")
    assert Instance.objects.get(pk=young.pk).state == Instance.State.RUNNING
    assert AuditEvent.objects.filter(action="instance.cull", target_id=str(old.pk)).exists()


def test_durations_read_as_a_person_says_them() -> None:
    assert [duration(s) for s in (30, 600, 7800, 7200, 200000)] == ["30 s", "10 min", "2 h 10 min", "2 h", "2 d 7 h"]


def test_a_culled_notebooks_page_says_why_and_starts_it_again(world: World) -> None:
    from django.test import Client

    from apps.compute.actions import check_launch_instance, check_launch_notebook, do_cull_notebook

    box = check_launch_instance(world.team_a, name="box", profile=world.cpu_small, acting_user=world.alice)
    notebook = check_launch_notebook(
        world.team_a, instance=box, name="lab", profile=world.minimal, acting_user=world.alice
    )
    do_cull_notebook(notebook, "culled: idle for 2 h 10 min")
    pages = {}
    for user in (world.bob, world.victor):  # a member; a viewer
        client = Client()
        client.force_login(user)
        pages[user.username] = client
    page = pages["bob"].get(f"/w/team-a/notebooks/{notebook.pk}/").content.decode()
    assert "Stopped by the portal, culled: idle for 2 h 10 min. Its files are where they were." in page
    assert "Start again" in page
    assert "Start again" not in pages["victor"].get(f"/w/team-a/notebooks/{notebook.pk}/").content.decode()
    assert f"/w/team-a/notebooks/{notebook.pk}/" in pages["bob"].get("/w/team-a/notebooks/").content.decode()
    assert pages["victor"].post(f"/w/team-a/notebooks/{notebook.pk}/start/").status_code == 403
    started = pages["bob"].post(f"/w/team-a/notebooks/{notebook.pk}/start/", follow=True)
    assert "Notebook lab is starting again." in started.content.decode()
    notebook.refresh_from_db()
    assert notebook.state == Notebook.State.PENDING and notebook.stop_reason == ""
    again = pages["bob"].post(f"/w/team-a/notebooks/{notebook.pk}/start/", follow=True)
    assert "only a stopped one starts" in again.content.decode()


def test_gpus_measured_busy_keep_a_notebook_from_being_idle(world: World, settings: Any) -> None:
    """Where telemetry exists, work on the instance's GPUs is activity, whatever Jupyter says: a
    server whose kernels have done nothing for a day, on an instance whose GPU was busy a minute
    ago, is not idle; once the GPU too is quiet, the day counts."""
    import threading
    from decimal import Decimal
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from apps.compute.actions import check_launch_instance, check_launch_notebook
    from apps.inventory.models import GPU
    from apps.telemetry.models import GpuSample

    class Idle(BaseHTTPRequestHandler):  # what an idle Jupyter server answers: no kernel, no terminal
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"[]")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Idle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        box = check_launch_instance(world.team_a, name="box", profile=world.gpu_1, acting_user=world.alice)
        notebook = check_launch_notebook(
            world.team_a, instance=box, name="lab", profile=world.minimal, acting_user=world.alice
        )
        now = timezone.now()
        Notebook.objects.filter(pk=notebook.pk).update(
            state=Notebook.State.READY,
            proxy_target=f"http://127.0.0.1:{server.server_address[1]}",
            started_at=now - timedelta(days=1),
        )
        notebook.refresh_from_db()
        assert last_activity(notebook, now) == now - timedelta(days=1)
        gpu = GPU.objects.first()
        assert gpu is not None and box.gpus_per_replica == Decimal(1)
        sample = {"gpu": gpu, "resolution_s": 0, "memory_used_mb": 1, "memory_total_mb": 2, "workload": box}
        GpuSample.objects.create(at=now - timedelta(minutes=1), utilisation=90.0, **sample)
        assert last_activity(notebook, now) == now - timedelta(minutes=1)
        settings.PORTAL_CULL_GPU_BUSY_PERCENT = 95  # 90 % is under this threshold: quiet
        assert last_activity(notebook, now) == now - timedelta(days=1)
    finally:
        server.shutdown()


def test_an_instance_is_culled_when_idle_only_where_its_gpus_are_measured(
    world: World, mailbox: Mailbox, settings: Any
) -> None:
    from apps.compute.actions import check_launch_instance
    from apps.inventory.models import GPU
    from apps.telemetry.models import GpuSample

    settings.PORTAL_CULL_WARNING_S = 30
    now = timezone.now()
    measured = check_launch_instance(world.team_a, name="measured", profile=world.gpu_1, acting_user=world.alice)
    unmeasured = check_launch_instance(world.team_a, name="unmeasured", profile=world.gpu_1, acting_user=world.alice)
    Instance.objects.filter(pk__in=[measured.pk, unmeasured.pk]).update(
        state=Instance.State.RUNNING, started_at=now - timedelta(hours=3)
    )
    Workspace.objects.filter(pk=world.team_a.pk).update(max_idle_s=3600)
    gpu = GPU.objects.first()
    sample = {"gpu": gpu, "resolution_s": 0, "memory_used_mb": 1, "memory_total_mb": 2, "workload": measured}
    GpuSample.objects.create(at=now - timedelta(hours=2), utilisation=80.0, **sample)  # busy two hours ago
    GpuSample.objects.create(at=now - timedelta(seconds=5), utilisation=1.0, **sample)  # quiet since

    assert cull(now)["idle_warned"] == 1  # the measured one only
    [mail] = mailbox.wait_for(1)
    assert mail["Subject"] == "Instance measured will be deleted in 30 s: it is idle"
    assert "its GPUs have done no work" in body_of(mail)
    assert "deleted in 30 s, giving its GPUs back." in " ".join(body_of(mail).split())  # an instance does
    assert Instance.objects.get(pk=measured.pk).state == Instance.State.RUNNING
    assert cull(now + timedelta(seconds=10))["idle_culled"] == 0  # the warning's time first
    assert cull(now + timedelta(seconds=31))["idle_culled"] == 1
    culled = Instance.objects.get(pk=measured.pk)
    assert culled.state in (Instance.State.DELETING, Instance.State.DELETED)
    assert culled.stop_reason == "culled: idle for 2 h"
    untouched = Instance.objects.get(pk=unmeasured.pk)
    assert untouched.state == Instance.State.RUNNING and untouched.idle_warned_at is None


def test_an_instance_whose_gpus_are_busy_is_not_idle(world: World, settings: Any) -> None:
    from apps.compute.actions import check_launch_instance
    from apps.inventory.models import GPU
    from apps.telemetry.models import GpuSample

    now = timezone.now()
    box = check_launch_instance(world.team_a, name="busy", profile=world.gpu_1, acting_user=world.alice)
    Instance.objects.filter(pk=box.pk).update(state=Instance.State.RUNNING, started_at=now - timedelta(hours=3))
    Workspace.objects.filter(pk=world.team_a.pk).update(max_idle_s=3600)
    GpuSample.objects.create(gpu=GPU.objects.first(), at=now - timedelta(minutes=1), resolution_s=0, utilisation=70.0,
                             memory_used_mb=1, memory_total_mb=2, workload=box)  # fmt: skip
    assert cull(now) == {"idle_warned": 0, "idle_culled": 0, "runtime_culled": 0}
