"""What the inference tests share: a profile of the llama.cpp server, a tiny model in a workspace's
directory, and an endpoint row made as the API makes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from apps.catalog.models import InferenceProfile
from apps.inference.actions import check_create_endpoint
from apps.inference.models import Endpoint
from apps.workspaces.models import Workspace
from tests.inference.tinymodel import write_tiny_gguf


def cpu_profile(name: str = "llama-cpu", **fields: Any) -> InferenceProfile:
    values: dict[str, Any] = {
        "server": InferenceProfile.Server.LLAMACPP, "cpu_cores": 1, "memory_gb": 2, "concurrency": 2,
        "scale_up_after_s": 2, "scale_down_after_s": 5, "published": True,
    }  # fmt: skip
    return InferenceProfile.objects.create(name=name, **{**values, **fields})


def model_in(workspace: Workspace, relative: str = "models/tiny.gguf") -> str:
    """A tiny model written into the workspace's directory; its path there."""
    path = Path(settings.PORTAL_WORK_DIR) / workspace.name / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        write_tiny_gguf(path)
    return relative


def endpoint(workspace: Workspace, user: Any, profile: InferenceProfile, **options: Any) -> Endpoint:
    options.setdefault("path", model_in(workspace))
    return check_create_endpoint(
        workspace, name=options.pop("name", "chat"), profile=profile, acting_user=user, **options
    )
