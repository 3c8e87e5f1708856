"""The portal served for real to a real browser: Daphne (ASGI, WebSockets) behind
configurable-http-proxy, a Celery worker and the scheduler loop, all on the test database,
driven by Debian's Chromium through Playwright.

Run in their own pytest process (deploy/test.sh does): Playwright's event loop would break
asyncio tests that come after it in the same process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.conf import global_settings
from django.db import connections
from playwright.sync_api import expect

from tests.leftovers import stop_everything_of
from tests.proxy import ROOT, free_port, running_proxy
from tests.test_embedded import EmbeddedPortal

# Playwright's sync API runs an event loop in this thread; the tests' ORM calls are still synchronous.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Where the journeys keep their pictures: var/screenshots (ignored by git) unless asked for
# elsewhere; PORTAL_SCREENSHOTS_DIR=docs/screenshots refreshes the README's.
SCREENSHOTS = (ROOT / os.environ.get("PORTAL_SCREENSHOTS_DIR", "var/screenshots")).resolve()
T = TypeVar("T")


@dataclass
class Portal:
    url: str  # the proxy: where browsers go, notebooks included (each on its own *.localhost name)
    data_dir: Path


def _wait_for(url: str, children: list[subprocess.Popen[bytes]], log_dir: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(child.poll() is not None for child in children):
            break
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    logs = "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted(log_dir.glob("*.log")))
    raise RuntimeError(f"the portal did not start at {url}:\n{logs}")


@pytest.fixture(scope="session")
def browser_type_launch_args() -> dict[str, Any]:
    """pytest-playwright launches Debian's Chromium, never a downloaded browser."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: deploy/test.sh installs Debian's chromium (apt-get install chromium)")
    return {"executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def browser_context_args() -> dict[str, Any]:
    return {"viewport": {"width": 1280, "height": 860}, "accept_downloads": True}


@pytest.fixture(scope="session")
def static_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pages' static files, collected once (hashed names, compressed) as deploy/run.sh does."""
    root = tmp_path_factory.mktemp("static")
    env = {**os.environ, "STATIC_ROOT": str(root), "DJANGO_SETTINGS_MODULE": "portal.settings"}
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--no-input", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    return root


@pytest.fixture
def portal_settings() -> dict[str, str]:
    """Environment variables of the portal's processes beyond the ones `portal` sets (a test module
    overrides this fixture: single sign-on's, for example)."""
    return {}


@pytest.fixture
def portal(
    transactional_db: None, static_root: Path, tmp_path: Path, portal_settings: dict[str, str]
) -> Iterator[Portal]:
    """Web, worker and scheduler as `deploy/run.sh` starts them, on the test database and Redis.

    One per test, stopped before the test database is emptied for the next.
    """
    from django.db import connection

    data_dir = tmp_path / "portal"
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True)
    database = connection.settings_dict
    web_port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{database['USER']}:{database['PASSWORD']}@{database['HOST']}:{database['PORT']}/"
        f"{database['NAME']}",
        "PORTAL_DATA_DIR": str(data_dir),
        "STATIC_ROOT": str(static_root),
        "PORTAL_WORK_DIR": str(data_dir / "work"),
        "PORTAL_INTERNAL_URL": f"http://127.0.0.1:{web_port}",
        "PORTAL_SCHEDULER_TRIGGER": "task",
        "PORTAL_WORKLOAD_TRIGGER": "task",
        "PORTAL_SCHEDULER_INTERVAL_S": "1",
        "PORTAL_NOTEBOOK_ENV_DIR": os.environ.get(
            "PORTAL_TEST_ENV_DIR", str(Path.home() / ".cache" / "gpuportal" / "test-envs")
        ),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        **portal_settings,
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    python = sys.executable
    with running_proxy(f"http://127.0.0.1:{web_port}", log_dir / "proxy.log") as proxy:
        env = {**env, "PORTAL_PROXY_API_URL": proxy.api_url, "PORTAL_PROXY_AUTH_TOKEN": proxy.token}
        # Browsers reach the portal at the proxy, and each notebook at <name>-<id>.localhost on its port.
        env = {**env, "PORTAL_PUBLIC_URL": proxy.url, "PORTAL_NOTEBOOK_DOMAIN": "localhost"}
        commands = {
            "web": [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(web_port), "portal.asgi:application"],
            "worker": [
                python,
                "-m",
                "celery",
                "-A",
                "portal",
                "worker",
                "-Q",
                "celery,provision",
                "--pool=solo",
                "--loglevel=INFO",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ],
            "scheduler": [python, "manage.py", "run_scheduler"],
        }
        children = []
        for name, argv in commands.items():
            with open(log_dir / f"{name}.log", "ab") as log:
                children.append(
                    subprocess.Popen(
                        argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        try:
            _wait_for(f"{proxy.url}/healthz", children, log_dir)
            yield Portal(url=proxy.url, data_dir=data_dir)
        finally:
            for child in children:
                if child.poll() is None:
                    os.killpg(child.pid, 15)
            for child in children:
                try:
                    child.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, 9)
                    child.wait()
            stop_everything_of(str(data_dir / "work"))  # instances and notebooks the journey left


@dataclass
class EmbeddedSite:
    url: str
    username: str
    password: str  # the admin's, as the start printed it; the admin has a workspace of the same name
    data_dir: Path
    demo_password: str  # the demo user's (not an admin), as the start printed it


@pytest.fixture
def embedded_portal(tmp_path: Path) -> Iterator[EmbeddedSite]:
    """The embedded default started exactly as `bash deploy/run.sh` starts it (SQLite, the
    filesystem broker, no Redis), in a data directory of its own; stopped with Ctrl-C after the test."""
    data_dir = tmp_path / "embedded"
    portal = EmbeddedPortal(data_dir)
    try:
        url = portal.wait_ready()
        password = re.search(r"Login: admin / (\S+)", "".join(portal.output))
        demo = re.search(r"Login: demo / (\S+)", "".join(portal.output))
        assert password and demo, "".join(portal.output)
    except BaseException:
        portal.stop()
        raise
    yield EmbeddedSite(
        url=url, username="admin", password=password.group(1), data_dir=data_dir, demo_password=demo.group(1)
    )
    assert portal.stop() == 0, "".join(portal.output[-40:])  # a clean stop, nothing left behind


@pytest.fixture(autouse=True)
def _like_the_portal(settings: Any) -> None:
    """What the tests change directly (another user's action) reaches the real worker, as the portal's own
    changes do; and passwords are hashed as the portal checks them."""
    settings.PORTAL_SCHEDULER_TRIGGER = "task"
    settings.PORTAL_WORKLOAD_TRIGGER = "task"
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS


def off_the_loop(action: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run an action in a thread of its own: Playwright's event loop holds this one, and an action's
    live update (async_to_sync) cannot be sent from a thread that runs an event loop."""

    def run() -> T:
        try:
            return action(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


def sign_in(page: Any, url: str, username: str, password: str) -> None:
    """Sign in on the portal's page, as a person does, and land on the overview."""
    page.goto(f"{url}/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Welcome")


def screenshot(page: Any, name: str, *, live: bool = True) -> None:
    """Keep a picture of a main page (see SCREENSHOTS), as a person sees it once its live updates
    connected (unless `live` is False: a picture of a page that lost them)."""
    dot = page.locator("#live-status")
    if live and dot.count():
        expect(dot).to_have_text("Live", timeout=15_000)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=False)
