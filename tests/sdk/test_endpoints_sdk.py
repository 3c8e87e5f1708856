"""Inference endpoints through the SDK (``client.endpoints``), against a live embedded portal over
real HTTP.

The portal's admin publishes a profile of llama.cpp's server on CPU, and a tiny model made at test
time (tests/inference/tinymodel.py) lies in the workspace's directory: endpoints of workspace
demo-team really start, and their replicas really serve, in a few seconds. Here, what the SDK asks
and shows, and one request to the URL with a token it made (tests/inference/ has the rest).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from gpuportal import (
    APIError,
    Client,
    Conflict,
    Endpoint,
    EndpointSample,
    InferenceProfile,
    Job,
    NotFound,
    ScaleEvent,
    SpecError,
    ValidationError,
    WaitTimeout,
)

from tests.inference.tinymodel import write_tiny_gguf
from tests.sdk.conftest import LivePortal, until

pytestmark = pytest.mark.slow

PROFILE = "tests-cpu"
MODEL = "models/tiny.gguf"
# How long a replica of the tiny model may take to serve (it takes a few seconds).
READY_S = 120


def model_in(live: LivePortal, workspace: str, relative: str = MODEL) -> str:
    """The tiny model written into the live portal's directory of `workspace` (readable by its
    workloads, which run as the workspace's own user); its path there."""
    root = Path(os.environ.get("PORTAL_WORK_DIR") or live.data_dir / "work") / workspace
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = path.parent
    while folder != root:
        folder.chmod(0o755)
        folder = folder.parent
    if not path.exists():
        write_tiny_gguf(path)
        path.chmod(0o644)
    return relative


def cpu_profile(live: LivePortal) -> str:
    """The llama.cpp profile on CPU, published by the portal's admin (once per portal), the only
    one published: the demo's own profiles are unpublished, so that it is the users' default."""
    with Client.login(live.url, "admin", live.passwords["admin"]) as admin:
        names = [p.name for p in admin.profiles.inference()]
        for name in names:
            if name != PROFILE:
                admin.request("PATCH", f"inference-profiles/{name}/", json={"published": False})
        if PROFILE not in names:
            admin.request(
                "POST", "inference-profiles/",
                json={"name": PROFILE, "server": "llamacpp", "cpu_cores": 1, "memory_gb": 2, "concurrency": 2,
                      "published": True, "description": "llama.cpp on CPU"},
            )  # fmt: skip
    return PROFILE


def model_job(client: Client, workspace: str = "demo-team") -> Job:
    """A job that leaves the tiny model as its artifact model/tiny.gguf, finished."""
    job = client.jobs.submit(
        name="train", workspace=workspace, command=f"mkdir -p model && cp ../{MODEL} model/", artifacts=["model"]
    )
    job.wait(timeout=60)
    assert job.succeeded, job.logs()
    return job


def delete_live(client: Client, workspace: str) -> None:
    for endpoint in client.endpoints.list(workspace, state=["DEPLOYING", "READY", "IDLE"]):
        client.endpoints.delete(endpoint)


@contextmanager
def prepared(live: LivePortal) -> Iterator[Client]:
    """A client of the demo user, with the profile published and the model in its workspaces
    (written where it is not yet); the endpoints a test leaves are deleted on the way out."""
    cpu_profile(live)
    for workspace in ("demo", "demo-team"):
        model_in(live, workspace)
    with live.client() as client:
        try:
            yield client
        finally:
            for workspace in ("demo", "demo-team"):
                delete_live(client, workspace)


@pytest.fixture
def served(live_portal: LivePortal) -> Iterator[Client]:
    with prepared(live_portal) as client:
        yield client


def test_an_endpoint_is_deployed_served_scaled_and_deleted(served: Client, live_portal: LivePortal) -> None:
    endpoint = served.endpoints.create("sdk-chat", workspace="demo-team", path=MODEL, max_replicas=2)
    assert (endpoint.state, endpoint.profile, endpoint.model, endpoint.bounds) == ("DEPLOYING", PROFILE, MODEL, "1-2")
    assert (endpoint.min_replicas, endpoint.max_replicas, endpoint.scale_to_zero_s) == (1, 2, None)
    port = urlsplit(live_portal.url).port
    assert endpoint.url == f"http://ep-sdk-chat-{endpoint.id}.localhost:{port}/v1"  # the OpenAI API's base URL
    with pytest.raises(WaitTimeout, match=f"Endpoint {endpoint.id} is still DEPLOYING after waiting 0 s"):
        served.endpoints.wait_ready(endpoint.id, timeout=0)  # its server takes a second or two to start

    seen: list[str] = []
    assert endpoint.wait_ready(timeout=READY_S, on_update=lambda e: seen.append(e.state)) is endpoint
    assert (endpoint.state, endpoint.serving, endpoint.is_ready, seen[-1]) == ("READY", 1, True, "READY")
    [replica] = endpoint.replicas
    assert (replica.state, replica.version, replica.baseline) == ("READY", 1, True)
    steps = [step.step for step in replica.start_progress]  # how its start went, as a job's
    assert steps[0] == "queued" and "starting" in steps and all(step.ended_at for step in replica.start_progress)
    assert repr(endpoint) == f"<Endpoint {endpoint.id} sdk-chat READY 1/1-2 serving>"
    assert "READY" in endpoint._repr_html_() and endpoint.url in endpoint._repr_html_()

    by_name = served.endpoints.get("sdk-chat", workspace="demo-team")
    assert by_name.id == endpoint.id == served.endpoints.get(str(endpoint.id)).id
    assert endpoint.id in [e.id for e in served.endpoints.list("demo-team", state="READY")]
    events = endpoint.events()
    assert isinstance(events[-1], ScaleEvent)
    assert (events[-1].from_replicas, events[-1].to_replicas, events[-1].reason) == (0, 1, "deployed with 1 replica")
    assert "Uvicorn running" in until(endpoint.logs, lambda text: "Uvicorn running" in text)  # the server's own log
    assert all(isinstance(s, EndpointSample) for s in endpoint.metrics())
    token = endpoint.token(name="sdk test", expires_in_days=1)
    assert re.fullmatch(r"gpp_\w+_[\w-]+", token)
    # What an OpenAI client sends: the URL's /chat/completions, the token as its API key, the
    # endpoint's name as the model (its *.localhost host reached at 127.0.0.1, as docs/sdk.md says).
    answer = httpx.post(
        f"{live_portal.url}/v1/chat/completions",
        headers={"Host": urlsplit(endpoint.url).netloc, "Authorization": f"Bearer {token}"},
        json={"model": endpoint.name, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["role"] == "assistant"
    with Client(live_portal.url, token) as caller, pytest.raises(APIError) as closed:
        caller.me()  # the token opens this endpoint alone, not the portal's API
    assert closed.value.status in (401, 403)

    endpoint.scale(0, scale_to_zero_s=600)
    assert (endpoint.min_replicas, endpoint.max_replicas, endpoint.scale_to_zero_s) == (0, 2, 600)
    with pytest.raises(ValidationError) as refused:
        endpoint.scale(scale_to_zero_s=None)  # no minimum and never to zero: refused
    assert list(refused.value.fields) == ["min_replicas"]
    with pytest.raises(ValidationError, match=r"The minimum \(3\) must lie between 0 and the maximum \(2\)"):
        endpoint.scale(3)
    assert endpoint.refresh().min_replicas == 0  # nothing changed

    endpoint.delete()
    assert endpoint.state in ("DELETING", "DELETED")
    until(endpoint.refresh, lambda e: e.state == "DELETED")
    with pytest.raises(NotFound, match="Endpoint sdk-chat was not found in workspace demo-team"):
        served.endpoints.get("sdk-chat", workspace="demo-team")
    with pytest.raises(Conflict, match="already deleted"):
        endpoint.delete()


def test_a_finished_jobs_artifact_is_served_and_a_new_version_rolled_out(served: Client) -> None:
    job = model_job(served)
    endpoint = served.endpoints.create("sdk-job", workspace="demo-team", job=job, artifact="model/tiny.gguf")
    model = f"job {job.id}: model/tiny.gguf"
    assert (endpoint.source, endpoint.source_job, endpoint.model) == ("artifact", job.id, model)
    assert endpoint.path == f"job-{job.id}/model/tiny.gguf"  # where the model is, in the workspace's directory
    endpoint.wait_ready(timeout=READY_S)

    # A new version: its replica serves before the old one stops.
    endpoint.update(path=MODEL)
    assert (endpoint.version, endpoint.source, endpoint.model) == (2, "path", MODEL)
    endpoint.wait_ready(timeout=READY_S)
    assert endpoint.serving_current >= 1
    assert [r.version for r in endpoint.replicas if r.state == "READY"][-1] == 2
    until(endpoint.refresh, lambda e: [r.version for r in e.replicas] == [2])  # the old one stopped
    endpoint.update(description="the tiny model")
    assert (endpoint.version, endpoint.description) == (2, "the tiny model")
    endpoint.delete()


def test_a_jobs_artifact_directory_is_served(served: Client) -> None:
    job = model_job(served)
    endpoint = served.endpoints.create("sdk-dir", workspace="demo-team", job=job, artifact="model/")
    assert (endpoint.model, endpoint.path) == (f"job {job.id}: model", f"job-{job.id}/model")
    try:
        endpoint.wait_ready(timeout=READY_S)
    finally:
        if not endpoint.is_final:
            endpoint.delete()


def test_an_endpoint_scaled_to_zero_is_ready_without_a_replica(served: Client) -> None:
    idle = served.endpoints.create("sdk-idle", workspace="demo-team", path=MODEL, min_replicas=0,
                                   scale_to_zero_s=60)  # fmt: skip
    assert (idle.state, idle.replicas, idle.desired_replicas) == ("IDLE", [], 0)
    assert idle.wait_ready(timeout=5).is_ready  # the next request starts a replica
    assert idle.delete().state == "DELETED"  # no replica to stop


def test_bad_requests_are_refused_before_or_by_the_portal_and_leave_nothing(
    served: Client, live_portal: LivePortal
) -> None:
    with pytest.raises(SpecError, match="path: give a path, or a job and its artifact, not both"):
        served.endpoints.create("sdk-bad", path=MODEL, job=1, artifact="model/")
    with pytest.raises(SpecError, match="source_job: an artifact is a job's"):
        served.endpoints.create("sdk-bad", artifact="model/")
    with pytest.raises(SpecError, match="artifact: name the artifact of job 1"):
        served.endpoints.create("sdk-bad", job=1)
    with pytest.raises(SpecError, match="path: give the model"):
        served.endpoints.create("sdk-bad")
    with pytest.raises(ValidationError) as bounds:
        served.endpoints.create("sdk-bad", workspace="demo", path=MODEL, min_replicas=3, max_replicas=2)
    assert bounds.value.fields == {"min_replicas": ["The minimum (3) must lie between 0 and the maximum (2)."]}
    with pytest.raises(ValidationError) as missing:
        served.endpoints.create("sdk-bad", workspace="demo", path="models/missing.gguf")
    assert missing.value.fields == {"path": ["models/missing.gguf does not exist."]}

    # A job of another workspace of the user's is refused; one of a workspace it cannot see, too.
    team_job = model_job(served)
    with pytest.raises(ValidationError) as elsewhere:
        served.endpoints.create("sdk-bad", workspace="demo", job=team_job, artifact="model/")
    assert elsewhere.value.fields == {"source_job": ["No such job in this workspace."]}
    with Client.login(live_portal.url, "admin", live_portal.passwords["admin"]) as admin:
        hidden = admin.jobs.submit(name="hidden", workspace="admin", command="true")
    with pytest.raises(ValidationError) as invisible:
        served.endpoints.create("sdk-bad", workspace="demo", job=hidden.id, artifact="model/")
    assert invisible.value.fields == {"source_job": [f"No job {hidden.id} is visible to you."]}
    assert served.endpoints.list(name="sdk-bad") == []

    with pytest.raises(SpecError, match="give min_replicas, max_replicas or scale_to_zero_s"):
        served.endpoints.scale(1)
    with pytest.raises(NotFound, match="Endpoint 999999 was not found"):
        served.endpoints.scale(999999, max_replicas=2)


def test_another_tenants_endpoint_is_not_found(served: Client, live_portal: LivePortal) -> None:
    model_in(live_portal, "admin")
    with Client.login(live_portal.url, "admin", live_portal.passwords["admin"]) as admin:
        theirs = admin.endpoints.create(
            "theirs", workspace="admin", path=MODEL, profile=PROFILE, min_replicas=0, scale_to_zero_s=60
        )
        try:
            for attempt in (
                lambda: served.endpoints.get(theirs.id),
                lambda: served.endpoints.scale(theirs.id, max_replicas=3),
                lambda: served.endpoints.token(theirs.id),
                lambda: served.endpoints.events(theirs.id),
                lambda: served.endpoints.delete(theirs.id),
            ):
                with pytest.raises(NotFound, match=f"Endpoint {theirs.id} was not found"):
                    attempt()
            assert theirs.id not in [e.id for e in served.endpoints.list()]
        finally:
            admin.endpoints.delete(theirs)


def test_profiles_are_listed_and_the_only_one_is_the_default(served: Client) -> None:
    [profile] = served.profiles.inference()
    assert isinstance(profile, InferenceProfile)
    assert (profile.name, profile.server, profile.size, profile.concurrency) == (PROFILE, "llamacpp", "1 CPU, 2 GB", 2)
    endpoint = served.endpoints.create("sdk-default", workspace="demo", path=MODEL, min_replicas=0,
                                       scale_to_zero_s=60)  # fmt: skip
    assert isinstance(endpoint, Endpoint) and endpoint.profile == PROFILE
    endpoint.delete()
