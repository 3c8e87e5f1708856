"""Inference endpoints through the API and the autoscaler, without running a server: what is
refused and why, endpoint tokens, and each scaling decision with its reason. The servers
themselves: test_servers.py, test_serving.py."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.inference import proxy, scaling
from apps.inference.actions import record_replica_ready
from apps.inference.models import Endpoint, Replica, ScaleEvent, Traffic
from apps.jobs.actions import check_submit_job, do_cancel_job
from apps.jobs.models import Artifact, Job
from apps.scheduling.adapter import run_cycle
from tests.inference.endpoints import cpu_profile, endpoint, model_in
from tests.personas import World, api_token


@pytest.fixture(autouse=True)
def work(settings: Any, tmp_path: Path) -> Path:
    settings.PORTAL_WORK_DIR = tmp_path / "work"
    return settings.PORTAL_WORK_DIR


def create(world: World, user: Any, **data: Any) -> Any:
    body = {"workspace": "team-a", "name": "chat", "profile": "llama-cpu", **data}
    return world.client(user).post("/api/v1/endpoints/", body, format="json")


def test_an_endpoint_of_a_model_in_the_workspace_queues_its_minimum_replicas(world: World) -> None:
    cpu_profile()
    answer = create(world, world.alice, path=model_in(world.team_a), min_replicas=2, max_replicas=3)
    assert answer.status_code == 201, answer.json()
    data = answer.json()
    assert data["state"] == "DEPLOYING" and data["desired_replicas"] == 2
    assert data["url"].startswith("http") and data["url"].endswith("/v1") and "ep-chat-" in data["url"]
    replicas = Replica.objects.filter(endpoint_id=data["id"])
    assert [(r.state, r.baseline, r.version) for r in replicas] == [("QUEUED", True, 1)] * 2
    assert replicas[0].podsets.get().cpu_cores == 1
    assert ScaleEvent.objects.get(endpoint_id=data["id"]).reason == "deployed with 2 replicas"


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"path": "models/none.gguf"}, "path", "does not exist"),
        ({"path": "notes.txt"}, "path", "GGUF"),
        ({"path": "../team-b/models/tiny.gguf"}, "path", "'..'"),
        ({"path": "/etc/passwd"}, "path", "relative"),
        ({"path": "escape.gguf"}, "path", "inside the workspace"),
        ({"min_replicas": 3, "max_replicas": 2}, "min_replicas", "between 0 and the maximum"),
        ({"min_replicas": 0, "max_replicas": 2}, "min_replicas", "scale-to-zero delay"),
        ({"min_replicas": 0, "max_replicas": 2, "scale_to_zero_s": 5}, "scale_to_zero_s", "60 to"),
        ({"max_replicas": 65}, "max_replicas", "less than or equal to 64"),
        ({"profile": "huge"}, "cpu_cores", "may use at most"),
        ({"profile": "nope"}, "profile", "No profile named nope"),
    ],
)
def test_bad_endpoints_are_refused_per_field_and_leave_nothing(
    world: World, work: Path, data: dict[str, Any], field: str, words: str
) -> None:
    cpu_profile()
    cpu_profile("huge", cpu_cores=1000)
    model_in(world.team_a)
    model_in(world.team_b)
    (work / "team-a" / "notes.txt").write_text("not a model\n")
    os.symlink(work / "team-b" / "models" / "tiny.gguf", work / "team-a" / "escape.gguf")
    answer = create(world, world.alice, **{"path": "models/tiny.gguf", **data})
    assert answer.status_code in (400, 409), answer.json()
    fields = answer.json()["error"].get("fields", {})
    assert field in fields, answer.json()
    message = str(fields[field])
    assert str(work) not in str(answer.json())  # the portal's own paths are not told
    assert words in message, message
    assert not Endpoint.objects.exists() and not Replica.objects.exists()


def test_a_finished_jobs_artifact_is_served_and_another_tenants_job_is_not(world: World, work: Path) -> None:
    cpu_profile()
    ours = Job.objects.create(workspace=world.team_a, name="train", state="SUCCEEDED", command="true")
    job_dir = work / "team-a" / f"job-{ours.pk}"
    model_in(world.team_a, f"job-{ours.pk}/model/tiny.gguf")
    ours.backend_state = {"job_dir": str(job_dir)}
    ours.save()
    Artifact.objects.create(job=ours, path="model/tiny.gguf", size_bytes=1)
    theirs = Job.objects.create(workspace=world.team_b, name="train", state="SUCCEEDED", command="true")
    running = Job.objects.create(workspace=world.team_a, name="train", state="RUNNING", command="true")

    served = create(world, world.alice, source_job=ours.pk, artifact="model/")
    assert served.status_code == 201, served.json()
    assert served.json()["path"] == f"job-{ours.pk}/model"
    assert served.json()["source"] == "artifact"
    refused = create(world, world.alice, name="other", source_job=theirs.pk, artifact="model/")
    assert refused.status_code == 400 and "visible" in str(refused.json()["error"]["fields"]["source_job"])
    unfinished = create(world, world.alice, name="early", source_job=running.pk, artifact="model/")
    assert unfinished.status_code == 400 and "not succeeded" in str(unfinished.json()["error"]["fields"]["source_job"])
    missing = create(world, world.alice, name="gone", source_job=ours.pk, artifact="weights/")
    assert missing.status_code == 400 and "no artifact weights" in str(missing.json()["error"]["fields"]["artifact"])


def test_an_endpoint_token_calls_its_endpoint_alone(world: World) -> None:
    made = endpoint(world.team_a, world.alice, cpu_profile())
    client = world.client(world.alice)
    answer = client.post(f"/api/v1/endpoints/{made.pk}/tokens/", {"name": "chat app"}, format="json")
    assert answer.status_code == 200, answer.json()
    token = answer.json()["token"]
    listed = {t["name"]: t for t in client.get("/api/v1/tokens/").json()["results"]}
    assert listed["chat app"]["endpoint"] == "chat" and listed["chat app"]["workspace"] == "team-a"
    # It opens nothing of the portal's API, not even the endpoint's own record.
    from rest_framework.test import APIClient

    scoped = APIClient()
    scoped.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    for path in ("/api/v1/me/", f"/api/v1/endpoints/{made.pk}/", "/api/v1/jobs/"):
        refused = scoped.get(path)
        assert refused.status_code == 401 and "one inference endpoint" in refused.json()["error"]["message"], path
    # A viewer may not make one; another tenant does not see the endpoint at all.
    viewer = world.client(world.victor).post(f"/api/v1/endpoints/{made.pk}/tokens/", {"name": "x"}, format="json")
    assert viewer.status_code == 403
    stranger = world.client(world.charlie).post(f"/api/v1/endpoints/{made.pk}/tokens/", {"name": "x"}, format="json")
    assert stranger.status_code == 404


def _traffic(made: Endpoint, *, in_flight: int = 0, waiting: int = 0, waited_s: float = 0.0) -> None:
    now = timezone.now()
    Traffic.objects.update_or_create(
        endpoint=made, process="test",
        defaults={"in_flight": in_flight, "waiting": waiting, "updated_at": now,
                  "waiting_since": now - timedelta(seconds=waited_s) if waiting else None},
    )  # fmt: skip


def _live(made: Endpoint) -> list[Replica]:
    return list(Replica.objects.filter(endpoint=made, state__in=scaling.LIVE))


def test_requests_that_wait_add_replicas_up_to_the_maximum_and_quiet_takes_them_away(world: World) -> None:
    made = endpoint(world.team_a, world.alice, cpu_profile(), min_replicas=1, max_replicas=3)
    _traffic(made, in_flight=2, waiting=0)
    scaling.upkeep()  # 2 at once: what one replica takes
    assert Endpoint.objects.get(pk=made.pk).pressed_since is None
    _traffic(made, in_flight=2, waiting=5)
    scaling.upkeep()
    made.refresh_from_db()
    assert made.desired_replicas == 1 and made.pressed_since is not None  # not pressed long enough yet
    Endpoint.objects.filter(pk=made.pk).update(pressed_since=timezone.now() - timedelta(seconds=3))
    scaling.upkeep()
    made.refresh_from_db()
    assert made.desired_replicas == 3 and len(_live(made)) == 3  # 7 requests, 2 at once each: 4, at most 3
    event = ScaleEvent.objects.filter(endpoint=made).first()
    assert (event.from_replicas, event.to_replicas) == (1, 3)
    assert event.reason == "7 requests in flight or waiting (5 waiting) for 3 s"
    extra = [r for r in _live(made) if not r.baseline]
    assert len(extra) == 2 and all(r.preemptible and r.priority < 0 for r in extra)

    _traffic(made)  # quiet: down only after the profile's 5 s
    scaling.upkeep()
    assert Endpoint.objects.get(pk=made.pk).desired_replicas == 3
    Endpoint.objects.filter(pk=made.pk).update(quiet_since=timezone.now() - timedelta(seconds=6))
    scaling.upkeep()
    made.refresh_from_db()
    assert made.desired_replicas == 1
    live = _live(made)
    assert len(live) == 1 and live[0].baseline  # the extra ones went first
    assert "served the load" in ScaleEvent.objects.filter(endpoint=made).first().reason


def test_a_quiet_endpoint_scales_to_zero_and_a_request_brings_one_replica_back(world: World) -> None:
    made = endpoint(world.team_a, world.alice, cpu_profile(), min_replicas=1, max_replicas=2, scale_to_zero_s=60)
    Endpoint.objects.filter(pk=made.pk).update(last_request_at=timezone.now() - timedelta(seconds=61))
    scaling.upkeep()
    made.refresh_from_db()
    assert made.state == "IDLE" and made.desired_replicas == 0 and not _live(made)
    assert ScaleEvent.objects.filter(endpoint=made).first().reason == "no request for 60 s"
    scaling.upkeep()  # it stays down: the minimum does not bring it back by itself
    assert Endpoint.objects.get(pk=made.pk).desired_replicas == 0

    _traffic(made, waiting=1, waited_s=0)  # a cold start: at once, whatever the delay
    scaling.upkeep()
    made.refresh_from_db()
    assert made.desired_replicas == 1 and made.state == "DEPLOYING" and len(_live(made)) == 1
    assert ScaleEvent.objects.filter(endpoint=made).first().reason == "1 request waiting and no replica runs"


def test_a_replica_that_never_served_fails_a_new_endpoint_with_its_reason(world: World) -> None:
    made = endpoint(world.team_a, world.alice, cpu_profile(), min_replicas=2, max_replicas=2)
    first, second = _live(made)
    Replica.objects.filter(pk=first.pk).update(state="FAILED", reason="the server exited: gguf_init failed")
    scaling.upkeep()
    made.refresh_from_db()
    assert made.state == "FAILED" and "did not start: the server exited: gguf_init failed" in made.failure_reason
    assert Replica.objects.get(pk=second.pk).state == "STOPPED"  # nothing left running or waiting


def test_deleting_an_endpoint_stops_its_replicas_and_its_url_is_gone(world: World) -> None:
    made = endpoint(world.team_a, world.alice, cpu_profile())
    client = world.client(world.alice)
    assert client.delete(f"/api/v1/endpoints/{made.pk}/").status_code == 204
    made.refresh_from_db()
    assert made.state == "DELETED" and not _live(made)  # no replica had started
    assert client.delete(f"/api/v1/endpoints/{made.pk}/").status_code == 409


def test_each_replica_in_the_api_says_how_far_its_start_has_come(world: World) -> None:
    made = endpoint(world.team_a, world.alice, cpu_profile())
    run_cycle()
    [replica] = _live(made)
    assert Replica.objects.get(pk=replica.pk).state == Replica.State.ADMITTED  # admitted, no worker took it yet
    shown = world.client(world.alice).get(f"/api/v1/endpoints/{made.pk}/").json()["replicas"]
    [waiting] = shown[0]["start_progress"]
    assert waiting["step"] == "queued" and waiting["ended_at"] is None and "worker" in waiting["detail"]


def test_another_tenant_neither_sees_nor_changes_an_endpoint(world: World) -> None:
    made = endpoint(world.team_a, world.alice, cpu_profile())
    stranger = world.client(world.charlie)
    assert stranger.get(f"/api/v1/endpoints/{made.pk}/").status_code == 404
    assert stranger.patch(f"/api/v1/endpoints/{made.pk}/", {"max_replicas": 3}, format="json").status_code == 404
    assert stranger.delete(f"/api/v1/endpoints/{made.pk}/").status_code == 404
    assert stranger.get("/api/v1/endpoints/").json()["results"] == []
    viewer = world.client(world.victor)
    assert viewer.get(f"/api/v1/endpoints/{made.pk}/").status_code == 200
    assert viewer.patch(f"/api/v1/endpoints/{made.pk}/", {"max_replicas": 3}, format="json").status_code == 403


def test_an_endpoints_minimum_outranks_its_workspaces_jobs_and_its_extra_replicas_give_way_first(
    world: World, settings: Any
) -> None:
    settings.PORTAL_PREEMPTION_MIN_RUNTIME_S = 0
    gpu = cpu_profile("llama-gpu", gpu_type="h100", gpus=Decimal(1))

    def job(name: str, priority: int) -> Job:
        return check_submit_job(world.team_a, name=name, command="sleep 600", gpu_type="h100",
                                gpus_per_replica=Decimal(1), priority=priority, acting_user=world.alice)  # fmt: skip

    jobs = [job(f"train-{i}", 1000) for i in range(4)]  # the workspace's whole quota, at the highest priority
    run_cycle()
    assert all(Job.objects.get(pk=j.pk).state == "ADMITTED" for j in jobs)
    made = endpoint(world.team_a, world.alice, gpu, min_replicas=1, max_replicas=2)
    baseline = _live(made)[0]
    assert baseline.priority_class == "inference"
    run_cycle()
    run_cycle()
    assert Replica.objects.get(pk=baseline.pk).state == "ADMITTED"  # a job gave way to it
    evicted = [j for j in jobs if Job.objects.get(pk=j.pk).state != "ADMITTED"]
    assert len(evicted) == 1

    # An extra replica runs in what a cancelled job left, as unattended work of the lowest priority...
    do_cancel_job(Job.objects.get(pk=evicted[0].pk), acting_user=world.alice)  # back in line: first in
    do_cancel_job(Job.objects.get(pk=next(j.pk for j in jobs if j not in evicted)), acting_user=world.alice)
    Endpoint.objects.filter(pk=made.pk).update(desired_replicas=2)
    scaling.upkeep()
    extra = next(r for r in _live(made) if not r.baseline)
    assert (extra.priority_class, extra.priority, extra.preemptible) == ("unattended", -1000, True)
    run_cycle()
    assert Replica.objects.get(pk=extra.pk).state == "ADMITTED"
    # ...and is the first to give way to the workspace's next job, whatever its priority.
    late = job("late", 0)
    run_cycle()
    run_cycle()
    assert Replica.objects.get(pk=extra.pk).state == "STOPPED"
    assert "preempted" in Replica.objects.get(pk=extra.pk).reason
    assert Job.objects.get(pk=late.pk).state == "ADMITTED"
    assert Replica.objects.get(pk=baseline.pk).state == "ADMITTED"


def test_a_client_cannot_hold_every_thread_waiting_and_a_cold_endpoint_says_when_to_come_back(
    world: World, settings: Any
) -> None:
    settings.PORTAL_PUBLIC_URL = "http://127.0.0.1:8000"
    settings.PORTAL_NOTEBOOK_DOMAIN = "localhost"
    made = endpoint(world.team_a, world.alice, cpu_profile())  # no replica serves: none was started
    token = api_token(world.alice)
    headers = {"Host": f"{made.host}:8000", "Authorization": f"Bearer {token}", "Prefer": "wait=0"}
    body = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}]}
    client = Client()
    cold = client.post("/v1/chat/completions", body, content_type="application/json", headers=headers)
    assert cold.status_code == 503 and cold["Retry-After"] == "10"
    assert "no replica serves yet" in cold.json()["error"]["message"]
    with proxy.TRAFFIC.lock:
        proxy.TRAFFIC.counts(made.pk).waiting = proxy.MAX_WAITING
    full = client.post("/v1/chat/completions", body, content_type="application/json", headers=headers)
    assert full.status_code == 429 and full["Retry-After"] == "5"
    assert f"{proxy.MAX_WAITING} requests waiting" in full.json()["error"]["message"]


def test_a_replica_stopped_since_the_proxy_read_the_replicas_is_not_counted_as_serving(
    world: World, settings: Any
) -> None:
    settings.PORTAL_PUBLIC_URL = "http://127.0.0.1:8000"
    settings.PORTAL_NOTEBOOK_DOMAIN = "localhost"
    made = endpoint(world.team_a, world.alice, cpu_profile())
    with socket.socket() as closed:  # a port nothing listens on: the replica's, once it stopped
        closed.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with proxy.TRAFFIC.lock:  # read while it served, less than a second ago
        proxy.TRAFFIC.replicas[made.pk] = (time.monotonic(), [(10**9, gone, "key")])
    headers = {"Host": f"{made.host}:8000", "Authorization": f"Bearer {api_token(world.alice)}", "Prefer": "wait=0"}
    body = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}]}
    cold = Client().post("/v1/chat/completions", body, content_type="application/json", headers=headers)
    assert cold.status_code == 503
    assert "no replica serves yet" in cold.json()["error"]["message"]  # not "all 1 of its replicas are busy"
    assert proxy.TRAFFIC.serving(made) == []  # read again: none serves


def test_a_cold_endpoint_whose_replica_serves_only_after_the_request_gave_up_says_none_served_it(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cold start's cycle may run inline and take longer than the proxy keeps its list of
    replicas: the answer says what the request saw (none serving), not "all 1 busy"."""
    settings.PORTAL_PUBLIC_URL = "http://127.0.0.1:8000"
    settings.PORTAL_NOTEBOOK_DOMAIN = "localhost"
    made = endpoint(world.team_a, world.alice, cpu_profile())
    converge_one = scaling.converge_one

    def slow_start(pk: int, *args: Any) -> None:
        converge_one(pk, *args)
        record_replica_ready(Replica.objects.get(endpoint=made), target="http://127.0.0.1:9")
        time.sleep(proxy.REPLICAS_EVERY_S + 0.1)

    monkeypatch.setattr(scaling, "converge_one", slow_start)
    headers = {"Host": f"{made.host}:8000", "Authorization": f"Bearer {api_token(world.alice)}", "Prefer": "wait=0"}
    body = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}]}
    cold = Client().post("/v1/chat/completions", body, content_type="application/json", headers=headers)
    assert cold.status_code == 503
    assert "no replica serves yet" in cold.json()["error"]["message"]
    assert len(proxy.TRAFFIC.serving(made)) == 1  # read again: it serves now


def test_a_callers_access_is_one_query_for_a_member_and_a_second_only_to_tell_a_viewer_from_a_stranger(
    world: World,
) -> None:
    from django.db import connection
    from django.test.client import RequestFactory
    from django.test.utils import CaptureQueriesContext

    made = endpoint(world.team_a, world.alice, cpu_profile())
    counted: dict[str, int] = {}
    for name, user, refused in (("member", world.bob, None), ("viewer", world.victor, 403),
                                ("stranger", world.charlie, 404)):  # fmt: skip
        request = RequestFactory().post("/v1/chat/completions", HTTP_AUTHORIZATION=f"Bearer {api_token(user)}")
        with CaptureQueriesContext(connection) as queries:
            try:
                assert proxy.caller(request, made) == user and refused is None
            except proxy.Refused as refusal:
                assert refusal.status == refused
        counted[name] = len(queries)
    assert counted["member"] == counted["viewer"] - 1 == counted["stranger"] - 1
