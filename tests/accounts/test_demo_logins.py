"""What the embedded portal's start prints about signing in (seed_demo): the same password on every
start until the account's first sign-in, and with single sign-on on, which accounts still have one."""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def _start(capsys: Any) -> str:
    call_command("seed_demo")
    return str(capsys.readouterr().out)


def _printed_password(output: str, username: str) -> str:
    found = re.search(rf"Login: {username} / (\S+)", output)
    assert found, output
    return found.group(1)


def _token_status(username: str, password: str) -> int:
    answer = APIClient().post("/api/v1/auth/token/", {"username": username, "password": password}, format="json")
    return int(answer.status_code)


def test_it_prints_the_same_password_on_every_start_until_first_sign_in(
    settings: Any, tmp_path: Path, capsys: Any
) -> None:
    settings.DATA_DIR = tmp_path
    first = _printed_password(_start(capsys), "demo")
    kept = tmp_path / "demo_passwords" / "demo"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700

    again = _start(capsys)

    assert _printed_password(again, "demo") == first
    assert _token_status("demo", first) == 200  # the first sign-in

    after = _start(capsys)

    assert "Login: demo (password unchanged since first sign-in)" in after
    assert first not in after
    assert not kept.exists()
    assert _token_status("demo", first) == 200


def test_a_password_changed_since_it_was_printed_is_not_printed_again(
    settings: Any, tmp_path: Path, capsys: Any
) -> None:
    from django.contrib.auth import get_user_model

    settings.DATA_DIR = tmp_path
    first = _printed_password(_start(capsys), "admin")
    admin = get_user_model().objects.get(username="admin")
    admin.set_password("chosen-by-someone-else")
    admin.save()

    second = _printed_password(_start(capsys), "admin")

    assert second != first
    assert _token_status("admin", second) == 200


def test_with_single_sign_on_it_says_so_and_names_who_keeps_a_password(
    settings: Any, tmp_path: Path, capsys: Any
) -> None:
    settings.DATA_DIR = tmp_path
    settings.PORTAL_OIDC_ISSUER = "https://login.example.org/realms/research"
    settings.PORTAL_OIDC_PROVIDER_NAME = "Example University"
    settings.PORTAL_BREAK_GLASS_ADMIN = "admin"

    output = _start(capsys)

    assert "single sign-on through Example University (https://login.example.org/realms/research) is on" in output
    assert "only admin (PORTAL_BREAK_GLASS_ADMIN) still signs in with one" in output
    assert _token_status("admin", _printed_password(output, "admin")) == 200
    assert "Login: demo through single sign-on only" in output
    assert not re.search(r"Login: demo / ", output)
    assert "password unchanged" not in output


def test_with_single_sign_on_and_no_break_glass_admin_no_password_is_printed(
    settings: Any, tmp_path: Path, capsys: Any
) -> None:
    settings.DATA_DIR = tmp_path
    settings.PORTAL_OIDC_ISSUER = "https://login.example.org/realms/research"
    settings.PORTAL_BREAK_GLASS_ADMIN = ""

    output = _start(capsys)

    assert "Passwords: off for every account" in output
    assert " / " not in "".join(line for line in output.splitlines() if line.startswith("Login:"))
