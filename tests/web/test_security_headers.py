"""The pages' Content-Security-Policy and security headers, templates free of inline script, and
the warning every page shows while workloads run unsandboxed."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import Client
from django.test.utils import override_settings

from apps.compute.actions import check_launch_instance, check_launch_notebook
from apps.jobs.actions import check_submit_job
from tests.personas import World

SignedIn = Callable[[Any], Client]
TEMPLATES = Path(django_settings.BASE_DIR) / "templates"

# Who opens each page: the user pages as alice, the console and Django's admin as the admin,
# the sign-in pages and the API docs as anyone.
ALICE_PAGES = [
    "/",
    "/w/team-a/",
    "/w/team-a/jobs/",
    "/w/team-a/jobs/?tab=queue",
    "/w/team-a/jobs/new/",
    "/w/team-a/jobs/{job}/",
    "/w/team-a/instances/",
    "/w/team-a/instances/new/",
    "/w/team-a/instances/{instance}/",
    "/w/team-a/instances/{instance}/delete/",
    "/w/team-a/notebooks/",
    "/w/team-a/notebooks/new/",
    "/w/team-a/notebooks/{notebook}/",
    "/w/team-b/",  # another tenant's workspace: the 404 page
]
ADMIN_PAGES = [
    "/console/",
    "/console/inventory/",
    "/console/profiles/",
    "/console/profiles/compute/new/",
    "/console/workspaces/",
    "/console/workspaces/team-a/",
    "/console/people/",
    "/console/people/users/new/",
    "/admin/",
    "/admin/auth/user/",
]
ANONYMOUS_PAGES = ["/login/", "/admin/login/", "/api/docs/", "/api/redoc/"]
# Sources a script-src must never allow: inline code, eval, or scripts from anywhere.
UNSAFE_SCRIPT_SOURCES = {
    "'unsafe-inline'",
    "'unsafe-eval'",
    "'unsafe-hashes'",
    "*",
    "data:",
    "blob:",
    "http:",
    "https:",
}


def policy_of(response: Any) -> dict[str, list[str]]:
    """The response's Content-Security-Policy, directive by directive."""
    header = response.headers.get("Content-Security-Policy")
    assert header, f"no Content-Security-Policy on {response.request['PATH_INFO']}"
    policy: dict[str, list[str]] = {}
    for directive in header.split(";"):
        name, *sources = directive.split()
        policy[name] = sources
    return policy


@pytest.fixture
def pages(world: World) -> dict[str, list[str]]:
    job = check_submit_job(
        world.team_a, name="train", command="true", gpu_type="h100", gpus_per_replica=Decimal(1), acting_user=world.bob
    )
    instance = check_launch_instance(world.team_a, name="box", profile=world.cpu_small, acting_user=world.alice)
    notebook = check_launch_notebook(
        world.team_a, instance=instance, name="lab", profile=world.minimal, acting_user=world.alice
    )
    ids = {"job": job.pk, "instance": instance.pk, "notebook": notebook.pk}
    return {
        "alice": [url.format(**ids) for url in ALICE_PAGES],
        "admin": ADMIN_PAGES,
        "anonymous": ANONYMOUS_PAGES,
    }


def test_it_sends_a_policy_without_inline_script_or_eval_on_every_page(
    world: World, signed_in: SignedIn, pages: dict[str, list[str]]
) -> None:
    clients = {"alice": signed_in(world.alice), "admin": signed_in(world.admin), "anonymous": Client()}
    for who, urls in pages.items():
        for url in urls:
            response = clients[who].get(url)
            assert response.status_code in (200, 404), (url, response.status_code)
            policy = policy_of(response)
            script_src = policy.get("script-src")
            assert script_src and "'self'" in script_src, (url, script_src)
            assert not UNSAFE_SCRIPT_SOURCES & set(script_src), (url, script_src)
            assert "'unsafe-inline'" not in policy["style-src"], url
            assert policy["default-src"] == ["'self'"], url
            assert policy["object-src"] == ["'none'"], url
            assert policy["frame-ancestors"] == ["'none'"], url
            assert policy["base-uri"] == ["'self'"] and policy["form-action"] == ["'self'"], url
            assert policy["connect-src"] == ["'self'"], url


def test_it_sends_the_other_security_headers(world: World, signed_in: SignedIn, pages: dict[str, list[str]]) -> None:
    clients = {"alice": signed_in(world.alice), "admin": signed_in(world.admin), "anonymous": Client()}
    for who, urls in pages.items():
        for url in urls:
            response = clients[who].get(url)
            assert response.headers["X-Content-Type-Options"] == "nosniff", url
            assert response.headers["X-Frame-Options"] == "DENY", url
            assert response.headers["Referrer-Policy"] == "same-origin", url
            features = dict(item.split("=", 1) for item in response.headers["Permissions-Policy"].split(", "))
            for feature in ("camera", "microphone", "geolocation", "payment", "usb"):
                assert features[feature] == "()", (url, feature)
            assert features["clipboard-write"] == "(self)", url  # the pages' copy buttons
            # drf-spectacular answers its Swagger page with "unsafe-none" so that an OAuth2 sign-in
            # popup could reach its opener; every other page isolates its browsing context group.
            coop = "unsafe-none" if url == "/api/docs/" else "same-origin"
            assert response.headers["Cross-Origin-Opener-Policy"] == coop, url


def test_the_api_docs_inline_set_up_runs_only_with_the_nonce_of_its_response() -> None:
    client = Client()
    nonces = []
    for _ in range(2):
        response = client.get("/api/docs/")
        nonce_sources = [s for s in policy_of(response)["script-src"] if s.startswith("'nonce-")]
        assert len(nonce_sources) == 1
        nonce = nonce_sources[0][len("'nonce-") : -1]
        inline = re.findall(r"<script( nonce=\"([^\"]*)\")?>\s*\S", response.content.decode())
        assert inline == [(f' nonce="{nonce}"', nonce)]  # the one inline script, and it has the nonce
        assert "SwaggerUIBundle(" in response.content.decode()
        nonces.append(nonce)
    assert nonces[0] != nonces[1]
    # A page that runs no inline script gets no nonce: its policy allows only the portal's files.
    assert policy_of(client.get("/login/"))["script-src"] == ["'self'"]


def test_htmx_is_configured_to_evaluate_nothing_and_inject_no_style(world: World, signed_in: SignedIn) -> None:
    page = signed_in(world.alice).get("/w/team-a/jobs/").content.decode()
    meta = re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", page)
    assert meta, "web/base.html must configure htmx before htmx.min.js loads"
    assert page.index('name="htmx-config"') < page.index("htmx.min.js")
    config = json.loads(meta.group(1))
    assert config["allowEval"] is False and config["includeIndicatorStyles"] is False
    assert config["allowScriptTags"] is False


# --- templates: no inline script, no inline handler, no javascript: URL ------------------------

# Templates allowed an inline script, and why. Each must carry this response's nonce.
NONCED_INLINE_SCRIPTS = {
    # drf-spectacular's Swagger UI set-up holds the CSRF token: it stays in the page, which another
    # site cannot include as a script.
    "drf_spectacular/swagger_ui.html",
    # Redoc's start hands the nonce on to the style elements Redoc writes.
    "drf_spectacular/redoc.html",
}
URL_ATTRIBUTES = {"href", "src", "action", "formaction", "data", "xlink:href", "hx-get", "hx-post"}


@dataclass
class Finding:
    line: int
    problem: str


class InlineCodeFinder(HTMLParser):
    """Everything in a template that a Content-Security-Policy without 'unsafe-inline' or
    'unsafe-eval' would block, or that htmx could only do with eval."""

    def __init__(self, nonce_allowed: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.nonce_allowed = nonce_allowed
        self.findings: list[Finding] = []
        self.script: tuple[int, dict[str, str]] | None = None
        self.script_text: list[str] = []

    def found(self, problem: str) -> None:
        self.findings.append(Finding(self.getpos()[0], problem))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        for name, value in values.items():
            if re.fullmatch(r"on[a-z]+", name):
                self.found(f"inline event handler {name}=")
            elif name == "style":
                self.found("inline style attribute (style-src has no 'unsafe-inline'): use a class in static/")
            elif name.startswith("hx-on") or name.startswith("data-hx-on"):
                self.found(f"{name}= runs code through eval")
            elif name in ("hx-vars", "data-hx-vars"):
                self.found("hx-vars evaluates JavaScript: use hx-vals with JSON")
            elif name in ("hx-vals", "hx-headers") and re.match(r"\s*(js|javascript):", value, re.IGNORECASE):
                self.found(f"{name}= with a js: expression")
            elif name == "hx-trigger" and "[" in value:
                self.found("hx-trigger with an event filter [...], which htmx evaluates: listen for a named event")
            if name in URL_ATTRIBUTES and re.match(r"\s*javascript:", value, re.IGNORECASE):
                self.found(f"javascript: URL in {name}=")
        if tag == "style":
            self.found("inline <style>: move it to a stylesheet in static/")
        if tag == "script":
            self.script = (self.getpos()[0], values)
            self.script_text = []

    def handle_data(self, data: str) -> None:
        if self.script is not None:
            self.script_text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag != "script" or self.script is None:
            return
        line, attrs = self.script
        self.script = None
        if not "".join(self.script_text).strip() or attrs.get("type") == "application/json":
            return
        if self.nonce_allowed and attrs.get("nonce") == "{{ request.csp_nonce }}":
            return
        self.findings.append(Finding(line, "inline <script> with code: move it to a file in static/"))


def inline_code(text: str, *, nonce_allowed: bool = False) -> list[Finding]:
    finder = InlineCodeFinder(nonce_allowed)
    finder.feed(text)
    finder.close()
    findings = finder.findings
    # What the parser cannot see as an attribute (inside a template tag, say) still shows as text.
    for number, line in enumerate(text.splitlines(), start=1):
        if re.search(r"javascript:", line, re.IGNORECASE) and not any(f.line == number for f in findings):
            findings.append(Finding(number, "javascript: URL"))
    return findings


def test_no_template_has_inline_script_handlers_or_javascript_urls() -> None:
    templates = sorted(TEMPLATES.rglob("*.html"))
    assert len(templates) > 30
    problems = []
    for path in templates:
        name = path.relative_to(TEMPLATES).as_posix()
        for finding in inline_code(path.read_text(), nonce_allowed=name in NONCED_INLINE_SCRIPTS):
            problems.append(f"templates/{name}:{finding.line}: {finding.problem}")
    assert not problems, "\n".join(problems)


def test_the_template_scan_finds_what_the_policy_would_block() -> None:
    text = "\n".join(
        [
            "<p>{% if x %}ok{% endif %}</p>",
            "<script>alert(1)</script>",
            '<script src="/static/web/live.js"></script>',
            '<script type="application/json" id="data">{"a": 1}</script>',
            '<button onclick="go()">Go</button>',
            '<a href="JavaScript:go()">go</a>',
            '<div hx-on:click="go()"></div>',
            '<div hx-trigger="live-job[detail.id==3] from:body"></div>',
            '<div hx-vals="js:{a: go()}"></div>',
            '<span style="width: 3%"></span>',
            "<style>p { color: red }</style>",
            '<script nonce="{{ request.csp_nonce }}">go()</script>',
        ]
    )
    assert [f.line for f in inline_code(text)] == [2, 5, 6, 7, 8, 9, 10, 11, 12]
    assert [f.line for f in inline_code(text, nonce_allowed=True)] == [2, 5, 6, 7, 8, 9, 10, 11]


# --- the warning while workloads run unsandboxed ----------------------------------------------

WARNING = "Workloads are not sandboxed:"


def test_every_page_warns_while_the_sandbox_is_off(
    world: World, signed_in: SignedIn, pages: dict[str, list[str]]
) -> None:
    with override_settings(PORTAL_SANDBOX="off"):
        for who in ("alice", "admin"):
            client = signed_in(getattr(world, who))
            for url in pages[who]:
                if url.startswith("/admin/") or url == "/w/team-b/":
                    continue  # Django's own admin and its plain 404 page have templates of their own
                page = client.get(url).content.decode()
                assert WARNING in page, url
                assert 'class="banner-warn" role="alert"' in page and "PORTAL_SANDBOX=bwrap" in page, url
        # Nobody signed in learns how the portal runs its workloads.
        assert WARNING not in Client().get("/login/").content.decode()


def test_no_page_warns_while_workloads_are_sandboxed(
    world: World, signed_in: SignedIn, pages: dict[str, list[str]]
) -> None:
    assert django_settings.PORTAL_SANDBOX == "bwrap"
    for who in ("alice", "admin"):
        client = signed_in(getattr(world, who))
        for url in pages[who]:
            assert WARNING not in client.get(url).content.decode(), url
