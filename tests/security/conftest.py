from __future__ import annotations

from collections.abc import Iterator

import pytest

from workers.backends.local import LocalBackend


@pytest.fixture
def started() -> Iterator[list[LocalBackend]]:
    """Local backends a test started: stopped at once after it."""
    backends: list[LocalBackend] = []
    yield backends
    for backend in backends:
        if backend.get_state():
            backend.stop(grace_s=0)
