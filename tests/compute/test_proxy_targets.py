"""Whether a notebook server answers at its route's target, as the authorize page asks before it
issues a sign-in code (apps/compute/proxy.py): a server that is gone answers nothing, a slow one is
still there."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.compute import proxy
from workers.backends.processes import socket_url


@pytest.fixture
def sock_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gpt-", dir="/tmp") as folder:
        yield Path(folder) / "jupyter.sock"


def test_a_server_that_is_gone_does_not_answer(sock_path: Path) -> None:
    assert not proxy.target_answers(socket_url(sock_path))  # no socket at all
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock_path))
    listener.close()  # a socket file nobody listens on any more: refused
    assert not proxy.target_answers(socket_url(sock_path))


def test_a_server_slow_to_answer_is_still_there(sock_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(proxy, "ANSWER_TIMEOUT_S", 0.2)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(sock_path))
        listener.listen(1)  # accepts the connection, never answers
        assert proxy.target_answers(socket_url(sock_path))
