"""Hostile requests to a Ray cluster's dashboard host (apps/rayclusters/proxy.py): another tenant,
a viewer, missing and forged credentials, replayed and misdirected sign-in codes, and what reaches
Ray. Ray's ports run whatever code reaches them: the portal's proxy is the one way in.

A real Ray head (the local backend's, with ``RAY_AUTH_MODE=token``) stands behind the cluster where
Ray's own answer matters; a recording HTTP server stands there to see what the proxy sends on."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.db import connections
from django.utils import timezone

from apps.accounts.api_tokens import do_revoke_token
from apps.accounts.models import ApiToken
from apps.accounts.tokens import workload_token
from apps.compute import hosts
from apps.jobs.models import Job
from apps.rayclusters import signin
from apps.rayclusters.models import RayCluster, RayDashboardCode
from apps.workspaces.models import Membership, Role, Workspace
from tests.personas import World, api_token
from tests.rayclusters.ray_dashboard import (
    DOMAIN,
    PUBLIC,
    RAY_PK,
    Head,
    HostClient,
    Recorder,
    body,
    cluster_row,
    on_host,
    ray_head,
    recording_server,
)


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    with ray_head() as started:
        yield started


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    with recording_server() as running:
        yield running


@pytest.fixture(autouse=True)
def _origins(settings: Any) -> None:
    settings.PORTAL_PUBLIC_URL = PUBLIC
    settings.PORTAL_NOTEBOOK_DOMAIN = DOMAIN


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _code(user: Any, cluster: RayCluster, next_path: str = "/") -> dict[str, str]:
    """A one-time code for ``user`` from the portal's authorize page (signed in there), as the
    callback's query: ``{"code", "next"}``."""
    portal = HostClient()
    portal.force_login(user)
    handoff = portal.get(f"/ray-clusters/authorize/{cluster.host_label}/", {"next": next_path})
    assert handoff.status_code == 302, body(handoff)
    return {k: v[0] for k, v in parse_qs(urlsplit(handoff["Location"]).query).items()}


def _signed_in(user: Any, cluster: RayCluster) -> HostClient:
    """A browser on the cluster's host with that host's cookie for ``user``."""
    browser = HostClient()
    answer = browser.get(hosts.CALLBACK_PATH, _code(user, cluster), **on_host(cluster))
    assert answer.status_code == 302, body(answer)
    return browser


def _jobs(head_cluster: RayCluster, token: str) -> bytes:
    answer = HostClient().get("/api/jobs/", **on_host(head_cluster, **_bearer(token)))
    assert answer.status_code == 200, body(answer)
    return body(answer)


# -- another tenant ------------------------------------------------------------------------------


def test_another_tenant_gets_a_404_with_a_token_or_a_session(world: World, recorder: Recorder) -> None:
    cluster = cluster_row(world.team_a, world.alice, recorder.url)
    charlies_job = Job.objects.create(workspace=world.team_b, name="probe", command="true", created_by=world.charlie)
    Job.objects.filter(pk=charlies_job.pk).update(state=Job.State.RUNNING)  # its token works while it runs
    alices_own = Workspace.objects.get(kind=Workspace.Kind.PRIVATE, assigned_user=world.alice)
    tokens = {
        "charlie's token": api_token(world.charlie),
        "charlie's job's token": workload_token(Job.objects.get(pk=charlies_job.pk)) or "",
        "alice's token for her own workspace only": api_token(world.alice, workspace=alices_own),
    }
    for who, token in tokens.items():
        for method in ("get", "post", "delete"):
            answer = getattr(HostClient(), method)("/api/jobs/", **on_host(cluster, **_bearer(token)))
            assert answer.status_code == 404, (who, method, answer.status_code, body(answer))
            assert body(answer) == b"No such Ray cluster.\n"
    # Signed in to the portal: its authorize page does not know the cluster either.
    portal = HostClient()
    portal.force_login(world.charlie)
    assert portal.get(f"/ray-clusters/authorize/{cluster.host_label}/").status_code == 404
    assert portal.get("/ray-clusters/authorize/ray-nothing-999999/").status_code == 404
    assert recorder.requests == []  # nothing of it reached the cluster


def test_a_code_is_single_use_and_bound_to_its_cluster(world: World, recorder: Recorder) -> None:
    cluster_a = cluster_row(world.team_a, world.alice, recorder.url)
    cluster_b = cluster_row(world.team_a, world.alice, recorder.url, pk=RAY_PK + 1, name="other")
    code_for_a = _code(world.bob, cluster_a)

    on_b = HostClient().get(hosts.CALLBACK_PATH, code_for_a, **on_host(cluster_b))
    assert on_b.status_code == 403 and not on_b.cookies  # a code for A is refused on B's host
    first = HostClient().get(hosts.CALLBACK_PATH, code_for_a, **on_host(cluster_a))
    assert first.status_code == 302 and first.cookies[signin.cookie_name()].value
    again = HostClient().get(hosts.CALLBACK_PATH, code_for_a, **on_host(cluster_a))
    assert again.status_code == 403 and not again.cookies  # spent
    assert RayDashboardCode.objects.get().code_hash != code_for_a["code"]  # only its hash is kept

    stale = _code(world.bob, cluster_a)
    RayDashboardCode.objects.filter(used_at__isnull=True).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert HostClient().get(hosts.CALLBACK_PATH, stale, **on_host(cluster_a)).status_code == 403

    # A's cookie on B's host (planted there, say) signs nobody in.
    browser_a = _signed_in(world.bob, cluster_a)
    on_b_page = browser_a.get("/api/jobs/", **on_host(cluster_b))
    assert on_b_page.status_code == 401
    assert browser_a.get("/api/jobs/", **on_host(cluster_a)).status_code == 201  # the recorder's answer


def test_next_is_a_path_on_the_clusters_own_host(world: World, recorder: Recorder) -> None:
    cluster = cluster_row(world.team_a, world.alice, recorder.url)
    for hostile in ("//evil.example/x", "https://evil.example/", "/\\evil.example", "javascript:alert(1)"):
        link = {**_code(world.bob, cluster), "next": hostile}  # a callback link made by someone else
        answer = HostClient().get(hosts.CALLBACK_PATH, link, **on_host(cluster))
        assert answer.status_code == 302 and answer["Location"] == "/", hostile


def test_a_code_is_worth_nothing_once_its_user_may_no_longer_see_the_cluster(world: World, recorder: Recorder) -> None:
    cluster = cluster_row(world.team_a, world.alice, recorder.url)
    code = _code(world.victor, cluster)
    Membership.objects.filter(workspace=world.team_a, user=world.victor).delete()
    answer = HostClient().get(hosts.CALLBACK_PATH, code, **on_host(cluster))
    assert answer.status_code == 403 and not answer.cookies


# -- a viewer --------------------------------------------------------------------------------------


def test_a_viewer_reads_the_dashboard_but_cannot_submit(world: World, head: Head) -> None:
    cluster = cluster_row(world.team_a, world.alice, head.endpoint.url)
    victor = api_token(world.victor)  # a viewer of team-a
    before = _jobs(cluster, victor)  # GET works: Ray's own answer
    for method in ("post", "put", "delete", "patch"):
        answer = getattr(HostClient(), method)(
            "/api/jobs/", {"entrypoint": "id"}, content_type="application/json", **on_host(cluster, **_bearer(victor))
        )
        assert answer.status_code == 403, (method, body(answer))
        assert b"Viewers of team-a" in body(answer)
    assert _jobs(cluster, api_token(world.alice)) == before  # nothing was submitted

    # In a browser too: the viewer signs in and reads, and submits nothing.
    browser = _signed_in(world.victor, cluster)
    assert browser.get("/api/jobs/", **on_host(cluster)).status_code == 200
    refused = browser.post("/api/jobs/", {"entrypoint": "id"}, content_type="application/json", **on_host(cluster))
    assert refused.status_code == 403


def test_a_read_only_token_reads_but_cannot_submit(world: World, recorder: Recorder) -> None:
    cluster = cluster_row(world.team_a, world.alice, recorder.url)
    reader = api_token(world.alice, scope=ApiToken.Scope.READ)
    assert HostClient().get("/api/jobs/", **on_host(cluster, **_bearer(reader))).status_code == 201
    submit = HostClient().post("/api/jobs/", {}, content_type="application/json", **on_host(cluster, **_bearer(reader)))
    assert submit.status_code == 403 and b"read-only" in body(submit)
    assert [r.method for r in recorder.requests] == ["GET"]


# -- missing and forged credentials ------------------------------------------------------------


def test_without_genuine_credentials_nothing_reaches_ray(world: World, recorder: Recorder) -> None:
    cluster = cluster_row(world.team_a, world.alice, recorder.url)
    # A script without a token is told to bring one; a browser is sent to sign in.
    bare = HostClient().get("/api/jobs/", **on_host(cluster))
    assert bare.status_code == 401 and bare["WWW-Authenticate"].startswith("Bearer")
    page = HostClient().get("/", **on_host(cluster, Accept="text/html"))
    assert page.status_code == 302 and page["Location"].startswith(f"{PUBLIC}/ray-clusters/authorize/")

    revoked = api_token(world.alice, name="old")
    do_revoke_token(ApiToken.objects.get(name="old"), reason="test", acting_user=world.alice)
    session = SessionStore()
    session["_auth_user_id"] = str(world.alice.pk)
    session.create()
    forged_cookie = signin.cookie_name() + "=" + "eyJjIjo4NzAwMDEsInUiOjJ9:forged:signature"
    for headers in (
        _bearer("gpp_000000000000_" + "x" * 43),  # the shape of a token, not one
        _bearer(revoked),
        _bearer(cluster.auth_token),  # the cluster's own Ray token is no portal credential
        {"Authorization": f"Basic {api_token(world.alice)}"},
        {"Authorization": "Bearer"},
        {"X-Ray-Authorization": f"Bearer {cluster.auth_token}"},
        {"Cookie": f"sessionid={session.session_key}"},  # the portal's own session: not here
        {"Cookie": forged_cookie},
        {"Cookie": f"ray-authentication-token={cluster.auth_token}"},
    ):
        for method in ("get", "post"):
            answer = getattr(HostClient(), method)("/api/jobs/", **on_host(cluster, **headers))
            assert answer.status_code == 401, (headers, method, answer.status_code)
    assert recorder.requests == []


def test_a_cookie_ends_with_its_users_credentials_and_access(world: World, recorder: Recorder) -> None:
    cluster = cluster_row(world.team_a, world.alice, recorder.url)
    browser = _signed_in(world.victor, cluster)
    assert browser.get("/api/jobs/", **on_host(cluster)).status_code == 201
    world.victor.set_password("a-new-one-entirely")
    world.victor.save()
    assert browser.get("/api/jobs/", **on_host(cluster)).status_code == 401  # signed in again, or nothing

    browser = _signed_in(world.victor, cluster)
    Membership.objects.filter(workspace=world.team_a, user=world.victor).delete()
    assert browser.get("/api/jobs/", **on_host(cluster)).status_code == 404
    Membership.objects.create(workspace=world.team_a, user=world.victor, role=Role.VIEWER)
    world.victor.is_active = False
    world.victor.save()
    assert browser.get("/api/jobs/", **on_host(cluster)).status_code == 401
    assert len(recorder.requests) == 1


def test_what_another_sites_page_fetches_from_the_host_is_not_signed_in(world: World, recorder: Recorder) -> None:
    """Every host under the notebook domain is the same site: a Lax cookie comes along with what a
    page on another tenant's notebook host makes the browser fetch here. Only the cluster's own
    pages, and pages the user opens, are signed in by it."""
    cluster = cluster_row(world.team_a, world.alice, recorder.url)
    browser = _signed_in(world.alice, cluster)
    for site, mode in (("same-site", "no-cors"), ("same-site", "cors"), ("cross-site", "no-cors")):
        answer = browser.get("/api/jobs/", **on_host(cluster, **{"Sec-Fetch-Site": site, "Sec-Fetch-Mode": mode}))
        assert answer.status_code == 401, (site, mode)
    framed = {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"}
    assert browser.get("/", **on_host(cluster, **framed)).status_code == 302  # sent to sign in: not signed in
    assert recorder.requests == []
    for site, mode in (("same-origin", "cors"), ("none", "navigate"), ("same-site", "navigate")):
        answer = browser.get("/api/jobs/", **on_host(cluster, **{"Sec-Fetch-Site": site, "Sec-Fetch-Mode": mode}))
        assert answer.status_code == 201, (site, mode)


# -- what reaches Ray ----------------------------------------------------------------------------


def test_no_credential_of_the_client_reaches_ray_and_none_of_rays_cookies_come_back(
    world: World, recorder: Recorder
) -> None:
    cluster = cluster_row(world.team_a, world.alice, recorder.url)
    token = api_token(world.alice)
    session = SessionStore()
    session["_auth_user_id"] = str(world.alice.pk)
    session.create()
    ray_cookie = _signed_in(world.alice, cluster).cookies[signin.cookie_name()].value
    cookies = f"sessionid={session.session_key}; csrftoken=abc; {signin.cookie_name()}={ray_cookie}"
    headers = {
        "Authorization": f"Bearer {token}",
        "X-Ray-Authorization": "Bearer planted",
        "Proxy-Authorization": "Basic cHJveHk6c2VjcmV0",
        "Cookie": cookies,
        "Connection": "X-Secret-Hop",
        "X-Secret-Hop": "1",
        "X-Request-Detail": "kept",
    }
    submitted = b'{"entrypoint": "true"}'
    answer = HostClient().post(
        "/api/jobs/?a=1&b=%2F",
        submitted,
        content_type="application/json",
        **on_host(cluster, **headers),
    )
    assert answer.status_code == 201
    (seen,) = recorder.requests
    assert seen.method == "POST" and seen.path == "/api/jobs/?a=1&b=%2F" and seen.body == submitted
    assert seen.headers["authorization"] == [f"Bearer {cluster.auth_token}"]  # the cluster's token, only
    for name in ("cookie", "x-ray-authorization", "proxy-authorization", "x-secret-hop"):
        assert name not in seen.headers, name
    assert seen.headers["x-request-detail"] == ["kept"] and seen.headers["content-type"] == ["application/json"]
    everything = repr(seen.headers).encode() + seen.body
    for secret in (token, session.session_key or "", ray_cookie):
        assert secret.encode() not in everything

    # Ray's answer: its body and own headers, never its cookies or its connection's headers.
    assert body(answer).startswith(b'{"ok": true')
    assert answer["X-Ray-Answer"] == "kept"
    assert not answer.cookies and "Set-Cookie" not in answer
    for name in ("X-Hop", "Keep-Alive", "Connection", "Access-Control-Allow-Credentials"):
        assert name not in answer, name

    # The browser's way in: its cookie stops at the proxy too.
    assert HostClient().get("/api/jobs/", **on_host(cluster, Cookie=cookies)).status_code == 201
    assert "cookie" not in recorder.requests[-1].headers
    assert recorder.requests[-1].headers["authorization"] == [f"Bearer {cluster.auth_token}"]
    assert cluster.auth_token.encode() not in body(answer)


def test_a_host_is_the_clusters_only_with_its_own_name(world: World, recorder: Recorder) -> None:
    cluster = cluster_row(world.team_a, world.alice, recorder.url)
    token = api_token(world.alice)
    for label in (f"ray-other-{cluster.pk}", f"x,{cluster.host_label}", f"{cluster.host_label}-1"):
        answer = HostClient().get("/api/jobs/", headers={"Host": f"{label}.{DOMAIN}:8000", **_bearer(token)})
        assert answer.status_code == 302 and "/notebooks/authorize/" in answer["Location"], label
    assert recorder.requests == []


def test_a_proxied_request_holds_no_database_connection_while_ray_answers(tx_world: World, recorder: Recorder) -> None:
    """A long upload or a slow answer of Ray's must not hold one of the process's few pooled
    connections: the portal's other requests would wait for it."""
    cluster = cluster_row(tx_world.team_a, tx_world.alice, recorder.url)
    token = api_token(tx_world.alice)
    ours = connections["default"]  # this thread's, which the proxy (in this thread) uses
    recorder.probe = lambda: ours.connection is None
    assert HostClient().get("/api/jobs/", **on_host(cluster, **_bearer(token))).status_code == 201
    assert recorder.requests[0].probed is True
