"""A platform as manifests: one document of every kind, as an admin's repository would hold them."""

from __future__ import annotations

import copy
from typing import Any

from rest_framework.test import APIClient

V1 = "gpuportal.io/v1"


def doc(kind: str, name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": V1, "kind": kind, "metadata": {"name": name}, "spec": spec or {}}


PLATFORM: dict[str, list[dict[str, Any]]] = {
    "platform/access.yaml": [doc("Group", "ml-team")],
    "platform/clusters.yaml": [
        doc("Cluster", "slurm-a", {"kind": "slurm", "connection": {"partition": "gpu"}, "placement": "spread"}),
        doc(
            "NodePool",
            "local/default",
            {"autoscaling": {"provider": "command", "command": "/bin/true", "max_nodes": 1, "scale_down_delay_s": 900}},
        ),
    ],
    "platform/profiles.yaml": [
        doc(
            "ComputeProfile",
            "gpu-2",
            {
                "display_name": "Two H100",
                "published": True,
                "gpu_type": "h100",
                "gpu_count": 2,
                "cpu_cores": 16,
                "memory_gb": 128,
            },
        ),
        doc(
            "NotebookProfile",
            "datasci",
            {
                "image": "quay.io/jupyter/scipy-notebook",
                "published": True,
                "python_packages": ["pandas"],
                "visible_to": ["ml-team"],
            },
        ),
        doc(
            "InferenceProfile",
            "llama-small",
            {"server": "llamacpp", "gpus": 0, "cpu_cores": 2, "memory_gb": 4, "concurrency": 8},
        ),
    ],
    "platform/workspaces.yaml": [
        doc("Cohort", "research", {"description": "Lends idle GPUs"}),
        doc(
            "Workspace",
            "vision",
            {
                "display_name": "Vision",
                "assignee_kind": "team",
                "assigned_group": "ml-team",
                "cohort": "research",
                "max_instances": 6,
                "allowed_profiles": ["gpu-2"],
                "can_borrow": True,
                "gpu_quotas": [{"gpu_type": "h100", "gpus": 4, "borrowing_limit": 2}],
                "provisioning_policy": {"auto_approve_max_s": 3600, "max_duration_s": 86400, "max_gpus": 4},
            },
        ),
        doc(
            "AlertRule",
            "Vision queue",
            {
                "kind": "queue_wait",
                "workspace": "vision",
                "threshold": "600",
                "for_s": 60,
                "emails": ["ops@example.org"],
            },
        ),
    ],
}


def platform() -> dict[str, list[dict[str, Any]]]:
    return copy.deepcopy(PLATFORM)


def items(files: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The documents as the CLI sends them: each with its file and its position there (from 1)."""
    return [{"source": source, "index": index, "manifest": manifest}
            for source, docs in files.items() for index, manifest in enumerate(docs, start=1)]  # fmt: skip


def apply(client: APIClient, files: dict[str, list[dict[str, Any]]], **options: Any) -> Any:
    return client.post("/api/v1/admin/manifests/", {"documents": items(files), **options}, format="json")


def actions_of(answer: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {(d["kind"], d["name"]): d["action"] for d in answer["documents"]}
