"""Settings come from the environment; bad values stop the portal at start with a clear message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.env import env_bool, env_choice, env_int, env_secret

ROOT = Path(__file__).resolve().parents[1]


def test_it_reads_booleans_and_refuses_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAG", "yes")
    assert env_bool("FLAG") is True
    monkeypatch.setenv("FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="FLAG='maybe' is not a boolean"):
        env_bool("FLAG")


def test_it_bounds_integers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("N", "12")
    assert env_int("N", 1, maximum=20) == 12
    monkeypatch.setenv("N", "twelve")
    with pytest.raises(ImproperlyConfigured, match="not an integer"):
        env_int("N", 1)
    monkeypatch.setenv("N", "0")
    with pytest.raises(ImproperlyConfigured, match="below the minimum of 1"):
        env_int("N", 5, minimum=1)


def test_it_reads_secrets_from_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("API_KEY_FILE", str(secret))
    assert env_secret("API_KEY") == "s3cret"
    monkeypatch.setenv("API_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="API_KEY_FILE=.* cannot be read"):
        env_secret("API_KEY")


def test_it_limits_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODE", "sideways")
    with pytest.raises(ImproperlyConfigured, match="must be one of: up, down"):
        env_choice("MODE", ("up", "down"), "up")


def _django_check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "ALLOWED_HOSTS", "PORTAL_ENV"}}
    return subprocess.run(
        [sys.executable, "manage.py", "check", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_refuses_to_start_without_a_secret_key() -> None:
    result = _django_check({"PORTAL_ENV": "production", "ALLOWED_HOSTS": "portal.example.org"})
    assert result.returncode != 0
    assert "SECRET_KEY (or SECRET_KEY_FILE) must be set when PORTAL_ENV=production" in result.stderr


def test_production_settings_pass_the_deployment_checks() -> None:
    env = {
        "PORTAL_ENV": "production",
        "SECRET_KEY": "k" * 20 + "-Xy9" * 10,
        "ALLOWED_HOSTS": "portal.example.org",
        "PORTAL_NOTEBOOK_DOMAIN": "nb.example.org",
    }
    result = _django_check(env, "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_portals_sharing_a_redis_database_each_take_their_own_keys() -> None:
    """PORTAL_REDIS_PREFIX starts this portal's Celery queues and Channels names in Redis (the
    parallel browser tests' portals, sharing one database, rely on it); unset, the names are
    Celery's and Channels' own."""
    show = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.CELERY_BROKER_TRANSPORT_OPTIONS, s.CHANNEL_LAYERS['default']['CONFIG']['prefix']]))"
    )
    base = {k: v for k, v in os.environ.items() if k != "PORTAL_REDIS_PREFIX"}
    base.update(REDIS_URL="redis://127.0.0.1:6379/15", DJANGO_SETTINGS_MODULE="portal.settings")
    seen = []
    for prefix in ("", "gw1:"):
        result = subprocess.run(
            [sys.executable, "-c", show], cwd=ROOT, env={**base, "PORTAL_REDIS_PREFIX": prefix},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        seen.append(json.loads(result.stdout.strip().splitlines()[-1]))
    timeout = {"visibility_timeout": 1800}  # see docs/operations.md, "Rolling restart"
    assert seen == [[timeout, "asgi"], [{**timeout, "global_keyprefix": "gw1:"}, "gw1:asgi"]]
