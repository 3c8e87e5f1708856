"""A JSON body takes the types the schema states: nothing is coerced into them."""

from __future__ import annotations

from typing import Any

import pytest

from apps.jobs.models import Job
from tests.personas import World

JOB = {"workspace": "team-a", "name": "typed", "command": "true"}


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"name": 0}, "name", "Expected a string."),
        ({"command": ["true"]}, "command", "Expected a string."),
        ({"preemptible": 1}, "preemptible", "Expected true or false."),
        ({"preemptible": "true"}, "preemptible", "Expected true or false."),
        ({"replicas": "2"}, "replicas", "Expected a whole number."),
        ({"replicas": True}, "replicas", "Expected a whole number."),
        ({"replicas": 1.5}, "replicas", "Expected a whole number."),
        ({"gpus_per_replica": 1, "gpu_type": "h100"}, "gpus_per_replica",
         'Expected a decimal number written as a string, such as "0.5".'),
        ({"env": {"A": 1}}, "env", "A: Expected a string."),
        ({"env": ["A=1"]}, "env", "Expected an object."),
        ({"artifact_paths": ["out", 2]}, "artifact_paths", "Item 1: Expected a string."),
        ({"workspace": 7}, "workspace", "Expected a string."),
    ],
)  # fmt: skip
def test_a_value_of_another_type_is_refused_not_coerced(
    world: World, change: dict[str, Any], field: str, message: str
) -> None:
    answer = world.client(world.alice).post("/api/v1/jobs/", {**JOB, **change}, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["fields"][field] == [message]
    assert not Job.objects.exists()


def test_the_right_types_are_accepted(world: World) -> None:
    body = {**JOB, "preemptible": False, "replicas": 2, "gpus_per_replica": "0.5", "gpu_type": "h100",
            "env": {"A": "1"}, "artifact_paths": ["out"], "max_runtime_s": None}  # fmt: skip
    answer = world.client(world.alice).post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 201, answer.content


def test_other_endpoints_are_strict_too(world: World) -> None:
    admin = world.client(world.admin)
    assert admin.post("/api/v1/cohorts/", {"name": "c", "description": 0}, format="json").status_code == 400
    assert admin.post("/api/v1/groups/", {"name": 0}, format="json").status_code == 400
    answer = admin.post("/api/v1/quotas/", {"workspace": "team-b", "gpu_type": "l4", "gpus": 2}, format="json")
    assert answer.json()["error"]["fields"]["gpus"][0].startswith("Expected a decimal number")
    assert admin.post("/api/v1/quotas/", {"workspace": "team-b", "gpu_type": "l4", "gpus": "2"},
                      format="json").status_code == 201  # fmt: skip
