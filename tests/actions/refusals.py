"""Asserting that an action refuses with a clear message and writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from apps.audit.models import AuditEvent
from apps.compute.models import Instance, Notebook
from apps.errors import ActionError
from apps.inventory.models import Allocation
from apps.jobs.models import Job
from apps.workspaces.models import GPUQuota, Workspace

WATCHED = (Instance, Notebook, Job, Allocation, AuditEvent, Workspace, GPUQuota)


def _counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in WATCHED}


@contextmanager
def refused(error: type[ActionError], message: str, *, field: str | None = None) -> Iterator[None]:
    """The block raises exactly `error` with `message` (and `field`), and no row is added or removed."""
    before = _counts()
    with pytest.raises(ActionError) as info:
        yield
    assert type(info.value) is error
    assert info.value.message == message
    if field is not None:
        assert info.value.field == field
    assert _counts() == before
