"""A Ray cluster's dashboard and Jobs API through the portal, on the cluster's own host, with the
portal's sign-in: a real Ray head (the local backend's, in its sandbox, on its Unix socket, with
``RAY_AUTH_MODE=token``) behind the portal's proxy. Hostile cases: tests/security/test_ray_proxy.py."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from ray.job_submission import JobStatus, JobSubmissionClient

from apps.accounts.tokens import workload_token
from apps.compute import hosts
from apps.rayclusters import proxy
from apps.rayclusters.models import RayCluster
from tests.api.endpoints import running_workload
from tests.personas import World, api_token
from tests.rayclusters.ray_dashboard import DOMAIN, PUBLIC, Head, HostClient, body, cluster_row, on_host, ray_head


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    with ray_head() as started:
        yield started


@pytest.fixture(autouse=True)
def _origins(settings: Any) -> None:
    settings.PORTAL_PUBLIC_URL = PUBLIC
    settings.PORTAL_NOTEBOOK_DOMAIN = DOMAIN


def _bearer(token: str) -> str:
    return f"Bearer {token}"


def test_a_portal_token_reaches_the_dashboard_and_its_jobs_api(world: World, head: Head) -> None:
    cluster = cluster_row(world.team_a, world.alice, head.endpoint.url)
    token = api_token(world.bob)
    client = HostClient()
    for scheme in ("Bearer", "Token", "bearer"):
        response = client.get("/api/version", **on_host(cluster, Authorization=f"{scheme} {token}"))
        assert response.status_code == 200, body(response)
        assert response.streaming and response["Content-Type"].startswith("application/json")
        assert b'"ray_version": "2.60.0"' in body(response)
    jobs = client.get("/api/jobs/", **on_host(cluster, Authorization=_bearer(token)))
    assert jobs.status_code == 200 and body(jobs).startswith(b"[")


def test_a_workloads_own_token_submits_a_job_as_jobs_may(world: World, head: Head) -> None:
    cluster = cluster_row(world.team_a, world.alice, head.endpoint.url)
    notebook = running_workload(world, world.alice, "notebook")  # GPUPORTAL_TOKEN in a portal notebook
    token = workload_token(notebook)
    assert token is not None
    submitted = HostClient().post(
        "/api/jobs/",
        {"entrypoint": "echo submitted-with-a-workload-token", "submission_id": "from-a-notebook"},
        content_type="application/json",
        **on_host(cluster, Authorization=_bearer(token)),
    )
    assert submitted.status_code == 200, body(submitted)
    assert b"from-a-notebook" in body(submitted)
    logs = _wait_for_logs(cluster, token, "from-a-notebook")
    assert "submitted-with-a-workload-token" in logs


def _wait_for_logs(cluster: RayCluster, token: str, submission: str, timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    client = HostClient()
    while time.monotonic() < deadline:
        info = client.get(f"/api/jobs/{submission}", **on_host(cluster, Authorization=_bearer(token)))
        if info.status_code == 200 and any(s.encode() in body(info) for s in ("SUCCEEDED", "FAILED", "STOPPED")):
            break
        time.sleep(0.5)
    logs = client.get(f"/api/jobs/{submission}/logs", **on_host(cluster, Authorization=_bearer(token)))
    assert logs.status_code == 200, body(logs)
    return body(logs).decode()


def test_a_browser_signs_in_through_the_portal_and_reads_the_dashboard(world: World, head: Head) -> None:
    cluster = cluster_row(world.team_a, world.alice, head.endpoint.url)
    dashboard = HostClient()  # the browser on the cluster's host: only that host's cookies
    landing = dashboard.get("/", {"view": "jobs"}, **on_host(cluster, Accept="text/html,*/*"))
    authorize = f"{PUBLIC}/ray-clusters/authorize/{cluster.host_label}/"
    assert landing.status_code == 302
    assert landing["Location"] == hosts.unauthenticated_redirect(authorize, "/", "view=jobs")

    portal = HostClient()  # the same browser on the portal's origin, signed in there
    portal.force_login(world.bob)
    handoff = portal.get(urlsplit(landing["Location"]).path, {"next": "/?view=jobs"})
    assert handoff.status_code == 302
    callback = urlsplit(handoff["Location"])
    assert f"{callback.scheme}://{callback.netloc}" == f"http://{cluster.host}:8000"
    assert callback.path == hosts.CALLBACK_PATH
    query = {k: v[0] for k, v in parse_qs(callback.query).items()}

    signed_in = dashboard.get(callback.path, query, **on_host(cluster))
    assert signed_in.status_code == 302 and signed_in["Location"] == "/?view=jobs"
    cookie = signed_in.cookies["gpuportal-ray"]
    assert cookie["httponly"] and cookie["samesite"] == "Lax" and cookie["path"] == "/"
    assert cookie["domain"] == "" and not cookie["secure"]  # host-only; http here
    assert cluster.auth_token not in cookie.value

    page = dashboard.get("/", {"view": "jobs"}, **on_host(cluster, Accept="text/html"))
    assert page.status_code == 200 and b"<title>Ray Dashboard</title>" in body(page)
    jobs = dashboard.get("/api/jobs/", **on_host(cluster, Accept="application/json"))
    assert jobs.status_code == 200 and body(jobs).startswith(b"[")
    # In a browser the dashboard only reads: nothing is submitted with the cookie.
    submit = dashboard.post("/api/jobs/", {"entrypoint": "true"}, content_type="application/json", **on_host(cluster))
    assert submit.status_code == 403 and b"read-only" in body(submit)


def test_the_cookie_is_secure_and_host_prefixed_when_the_portal_is_on_https(world: World, settings: Any) -> None:
    settings.PORTAL_PUBLIC_URL = "https://portal.example.org"
    settings.PORTAL_NOTEBOOK_DOMAIN = "apps.example.org"
    cluster = cluster_row(world.team_a, world.alice, "http+unix://%2Fnowhere.sock")
    portal = HostClient()
    portal.force_login(world.bob)
    handoff = portal.get(f"/ray-clusters/authorize/{cluster.host_label}/", {"next": "/"})
    assert handoff["Location"].startswith(f"https://{cluster.host}/portal-auth/callback?")
    query = {k: v[0] for k, v in parse_qs(urlsplit(handoff["Location"]).query).items()}
    signed_in = HostClient().get(hosts.CALLBACK_PATH, query, headers={"Host": cluster.host})
    cookie = signed_in.cookies["__Host-gpuportal-ray"]
    assert cookie["secure"] and cookie["httponly"] and cookie["domain"] == "" and cookie["path"] == "/"


def test_ray_job_submission_client_submits_uploads_and_reads_logs_through_the_portal(
    tx_world: World, head: Head, live_server: Any, tmp_path: Path
) -> None:
    """Ray's own client, as from a laptop: a working directory uploaded (Ray's package upload, a
    PUT with a body), the job submitted, its status and logs read, all with a portal token."""
    world = tx_world
    cluster = cluster_row(world.team_a, world.alice, head.endpoint.url)
    port = urlsplit(live_server.url).port
    app = tmp_path / "app"
    app.mkdir()
    (app / "hello.py").write_text("print('hello from the proxy')\n")
    # This machine's resolver knows no *.localhost: connect to loopback, with the name in Host (as a browser does).
    headers = {"Authorization": _bearer(api_token(world.alice)), "Host": f"{cluster.host}:{port}"}
    client = JobSubmissionClient(address=live_server.url, headers=headers)
    submission = client.submit_job(entrypoint="python hello.py", runtime_env={"working_dir": str(app)})
    deadline = time.monotonic() + 120
    while (status := client.get_job_status(submission)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED}:
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    logs = client.get_job_logs(submission)
    assert status == JobStatus.SUCCEEDED, logs
    assert "hello from the proxy" in logs

    notebook = running_workload(world, world.bob, "notebook")  # the same from a portal notebook
    inside = {"Authorization": _bearer(workload_token(notebook) or ""), "Host": f"{cluster.host}:{port}"}
    listed = JobSubmissionClient(address=live_server.url, headers=inside).list_jobs()
    assert submission in [job.submission_id for job in listed]


def _asgi(cluster: RayCluster, method: str, path: str, token: str, sent: bytes = b"") -> tuple[int, list[bytes]]:
    """One request through Django's ASGI handler, as the portal's server makes it: the answer's
    status and its body as the handler sent it, part by part."""
    headers = [(b"host", f"{cluster.host}:8000".encode()), (b"authorization", _bearer(token).encode())]
    if sent:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(sent)).encode())]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip

    async def call() -> tuple[int, list[bytes]]:
        communicator = ApplicationCommunicator(get_asgi_application(), scope)
        await communicator.send_input({"type": "http.request", "body": sent, "more_body": False})
        start = await communicator.receive_output(timeout=60)
        parts = [await communicator.receive_output(timeout=60)]
        while parts[-1].get("more_body"):
            parts.append(await communicator.receive_output(timeout=60))
        await communicator.wait(timeout=30)  # the handler closes Ray's answer and its connection
        return int(start["status"]), [part.get("body", b"") for part in parts]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Django warns when it must gather a synchronous iterator first
        return async_to_sync(call)()


def test_under_asgi_a_body_goes_to_ray_and_the_answer_is_streamed(tx_world: World, head: Head) -> None:
    """Through Django's ASGI handler, as the portal serves (each request's view in a thread of its
    own: hence committed rows): a job submitted with its body, and Ray's answers come as they are
    read, not gathered first."""
    cluster = cluster_row(tx_world.team_a, tx_world.alice, head.endpoint.url)
    token = api_token(tx_world.alice)
    status, parts = _asgi(cluster, "GET", "/api/version", token)
    assert status == 200 and b'"ray_version": "2.60.0"' in b"".join(parts)
    assert len(parts) >= 2  # the body as it came, then the end: a streamed answer
    job = b'{"entrypoint": "echo through-asgi", "submission_id": "through-asgi"}'
    status, parts = _asgi(cluster, "POST", "/api/jobs/", token, job)
    assert status == 200 and b'"submission_id": "through-asgi"' in b"".join(parts)


def test_the_dashboard_answers_503_while_the_cluster_does_not_run(world: World) -> None:
    # Its row still names where its dashboard was (a cluster starting again after a preemption).
    cluster = cluster_row(world.team_a, world.alice, "http+unix://%2Fnowhere.sock", state=RayCluster.State.ADMITTED)
    response = HostClient().get("/api/jobs/", **on_host(cluster, Authorization=_bearer(api_token(world.alice))))
    assert response.status_code == 503 and b"is not running (starting)" in body(response)
    portal = HostClient()
    portal.force_login(world.alice)
    assert portal.get(f"/ray-clusters/authorize/{cluster.host_label}/").status_code == 503


def test_a_dashboard_that_does_not_answer_is_a_502(world: World, tmp_path: Path) -> None:
    cluster = cluster_row(world.team_a, world.alice, f"http+unix://{str(tmp_path / 'gone.sock').replace('/', '%2F')}")
    response = HostClient().get("/api/jobs/", **on_host(cluster, Authorization=_bearer(api_token(world.alice))))
    assert response.status_code == 502 and b"does not answer" in body(response)


def test_a_websocket_is_not_proxied_and_says_how_to_read_logs(world: World) -> None:
    cluster = cluster_row(world.team_a, world.alice, "http+unix://%2Fnowhere.sock")
    response = HostClient().get(
        "/api/jobs/x/logs/tail",
        **on_host(cluster, Upgrade="websocket", Connection="Upgrade", Authorization=_bearer(api_token(world.alice))),
    )
    assert response.status_code == 501 and b"get_job_logs" in body(response)


def test_a_body_past_the_limit_is_refused_before_it_is_read(world: World, head: Head) -> None:
    cluster = cluster_row(world.team_a, world.alice, head.endpoint.url)
    response = HostClient().generic(
        "PUT",
        "/api/packages/gcs/_ray_pkg_big.zip",
        b"x" * 16,
        CONTENT_LENGTH=str(proxy.MAX_BODY_BYTES + 1),
        **on_host(cluster, Authorization=_bearer(api_token(world.alice))),
    )
    assert response.status_code == 413
