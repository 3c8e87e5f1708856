"""Every pod the Kubernetes backend makes asks for and is held to its CPU and memory: without
limits, a pod may take a node's whole CPU and memory from every other tenant's pods on it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.backends.test_kubernetes_isolation import POD_CASES
from workers.backends import kubernetes_objects as ko


def quantity_cpu(value: str) -> float:
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def quantity_memory(value: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    return int(value[:-2]) * units[value[-2:]] if value[-2:] in units else int(value)


@pytest.mark.parametrize("pod", [pod for _, pod in POD_CASES], ids=[case_id for case_id, _ in POD_CASES])
def test_every_container_of_every_pod_requests_and_is_limited_to_cpu_and_memory(pod: dict[str, Any]) -> None:
    for container in [*pod["containers"], *pod.get("initContainers", [])]:
        resources = container.get("resources", {})
        requests, limits = resources.get("requests", {}), resources.get("limits", {})
        assert {"cpu", "memory"} <= set(requests) and {"cpu", "memory"} <= set(limits), container["name"]
        assert quantity_cpu(requests["cpu"]) <= quantity_cpu(limits["cpu"])
        assert quantity_memory(requests["memory"]) <= quantity_memory(limits["memory"])


@pytest.mark.parametrize(
    "resources",
    [
        None,
        {"limits": {"cpu": "1", "memory": "1Gi"}},
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1"}},
        {"requests": {"memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
    ],
)
def test_no_pod_can_be_built_with_a_container_that_is_not_held_to_its_cpu_and_memory(
    resources: dict[str, Any] | None,
) -> None:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if resources is not None:
        container["resources"] = resources
    with pytest.raises(ValueError, match="container 'main' has no"):
        ko.restricted_pod_spec([container], ko.KubeSettings())
    with pytest.raises(ValueError, match="container 'main' has no"):
        ko.restricted_pod_spec(
            [{**container, "resources": ko.helper_resources()}], ko.KubeSettings(), initContainers=[container]
        )
