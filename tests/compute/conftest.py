from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _plain_static_files(settings: Any) -> None:
    """The portal's pages (sign-in, authorize) link the unhashed static files here, as in tests/web."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
