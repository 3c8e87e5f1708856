from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ci_skips import skip_fails
from tests.leftovers import release_disks, stop_everything_of
from tests.personas import World, make_world
from tests.proxy import Proxy, running_proxy

# Each test process its own workspace disk images (apps/workspaces/disks.py), named by workspace id
# as they are: ids repeat across the processes' databases. The portals a test starts inherit it.
DISK_IMAGE_DIR = Path(tempfile.gettempdir()) / f"gpuportal-test-disks-{os.getpid()}"
os.environ["PORTAL_DISK_IMAGE_DIR"] = str(DISK_IMAGE_DIR)
# Each portal a test starts in a data directory of its own holds a block of workspace uids in the
# machine's registry (workers/backends/uidblocks.py) until that directory is deleted: a range of a
# thousand blocks, so that the directories pytest keeps from earlier runs never use them all up.
os.environ.setdefault("PORTAL_WORKSPACE_UID_MAX", str(200_000 + 1000 * 100_000 - 1))
# The portals the tests start build no environment ahead of their starts (every published profile's,
# some of them large); the tests of that build ask for it (tests/workloads/test_start_progress.py).
os.environ["PORTAL_PREBUILD_ENVIRONMENTS"] = "0"


@pytest.fixture(autouse=True)
def _no_disk_outlives_the_test(settings: Any) -> Iterator[None]:
    """Where the tests run as root, a workload's workspace is a mounted disk image: unmounted, and
    the image removed, once the test is over (and its own fixtures have stopped its workloads)."""
    settings.PORTAL_DISK_IMAGE_DIR = DISK_IMAGE_DIR
    yield
    release_disks(DISK_IMAGE_DIR)


@pytest.fixture(autouse=True)
def _scheduler_runs_inline(settings: Any) -> None:
    """Actions run their scheduling cycle in-process on commit: deterministic tests."""
    settings.PORTAL_SCHEDULER_TRIGGER = "inline"
    # Admitted jobs start only where a test asks for it (PORTAL_WORKLOAD_TRIGGER = "inline").
    settings.PORTAL_WORKLOAD_TRIGGER = "off"
    # One work directory per test process: the orphan sweep of one never sees another's jobs.
    settings.PORTAL_WORK_DIR = Path(tempfile.gettempdir()) / f"gpuportal-test-work-{os.getpid()}"
    settings.PORTAL_PREBUILD_ENVIRONMENTS = False
    # Notebook environments are built once per machine and kept between runs.
    settings.PORTAL_NOTEBOOK_ENV_DIR = Path(
        os.environ.get("PORTAL_TEST_ENV_DIR", Path.home() / ".cache" / "gpuportal" / "test-envs")
    )


@pytest.fixture(autouse=True)
def _endpoint_traffic_forgotten() -> Iterator[None]:
    """What the endpoint proxy of this process counted goes with the test (its endpoints do)."""
    yield
    from apps.inference.proxy import TRAFFIC

    TRAFFIC.forget()


@pytest.fixture(scope="session", autouse=True)
def _own_redis_keys() -> None:
    """Each test process its own keys in the shared Redis (PORTAL_REDIS_PREFIX, which the portals it
    starts inherit): processes number their workspaces alike, and one's live updates must not reach
    another's sockets, nor one's portal's worker take another's tasks."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    from channels.layers import channel_layers
    from django.conf import settings

    from portal.celery import app

    os.environ["PORTAL_REDIS_PREFIX"] = prefix = f"{worker}:"
    config = settings.CHANNEL_LAYERS["default"].get("CONFIG")
    if config is not None and "prefix" in config:
        config["prefix"] = f"{prefix}asgi"
        channel_layers.backends.clear()
    if app.conf.broker_url.startswith(("redis://", "rediss://")):
        app.conf.broker_transport_options = {**app.conf.broker_transport_options, "global_keyprefix": prefix}


@pytest.fixture(autouse=True)
def _fresh_scheduler_state() -> None:
    from apps.scheduling.adapter import estimates_due
    from apps.scheduling.backoff import RECONCILE

    RECONCILE.reset()
    estimates_due.reset()  # each test's first cycle estimates, whatever the last test's cost


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    """The personas' passwords need not resist cracking here; PBKDF2 would dominate each test's setup."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def world(db: None) -> World:
    return make_world()


@pytest.fixture
def tx_world(transactional_db: None) -> World:
    """The same world, committed, for tests that use other threads or processes."""
    return make_world()


@pytest.fixture
def proxy(live_server: Any, settings: Any, tmp_path: Path) -> Iterator[Proxy]:
    """The proxy in front of the live portal, and the worker starting workloads in-process."""
    with running_proxy(live_server.url, tmp_path / "proxy.log") as running:
        settings.PORTAL_PROXY_API_URL = running.api_url
        settings.PORTAL_PROXY_AUTH_TOKEN = running.token
        settings.PORTAL_INTERNAL_URL = live_server.url
        settings.PORTAL_PUBLIC_URL = running.url  # notebooks: http://<name>-<id>.localhost:<proxy port>/
        settings.PORTAL_NOTEBOOK_DOMAIN = "localhost"
        # Its pages (sign-in, the notebooks' authorize page) link the unhashed static files.
        settings.STORAGES = {
            **settings.STORAGES,
            "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
        }
        settings.PORTAL_WORKLOAD_TRIGGER = "inline"
        settings.PORTAL_WORK_DIR = tmp_path / "work"
        try:
            yield running
        finally:
            stop_everything_of(str(settings.PORTAL_WORK_DIR))


# Notebook environments for Slurm's nodes, built with the system's Python: pytest's and the
# home directory's are private to the user running the tests.
SHARED_ENV_DIR = Path(os.environ.get("PORTAL_TEST_SHARED_ENV_DIR", "/var/cache/gpuportal/test-envs"))


@pytest.fixture
def shared_work() -> Iterator[Path]:
    """A work directory the workspaces' accounts can reach, as a cluster's shared filesystem is:
    pytest's own temporary directories are private to the user running the tests (0700)."""
    work = Path(tempfile.mkdtemp(prefix="gpuportal-slurm-")) / "work"
    work.parent.chmod(0o711)
    work.mkdir(mode=0o711)
    yield work
    shutil.rmtree(work.parent, ignore_errors=True)


def pytest_sessionstart(session: pytest.Session) -> None:
    from django.conf import settings

    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        pytest.exit("The suite runs on PostgreSQL: use deploy/test.sh, or set DATABASE_URL.", returncode=2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow (real processes, tens of seconds each) first, in their order: two test
    processes then work through them beside the quick ones and end together, rather than one
    running a long test alone at the end (deploy/test.sh)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _plain_static_files(settings: Any) -> None:
    """Pages link the unhashed files: what collectstatic left in the data directory is not these tests' concern
    (the browser tests serve the collected, hashed files)."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A security test that skips in CI fails instead (tests/ci_skips.py), saying why it skipped."""
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and skip_fails(str(item.path), os.environ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"a security test may not skip in CI: {reason.removeprefix('Skipped: ')}"
    return report
