"""Answers match the published OpenAPI schema where a review found they did not: a job without
GPUs, a job and an instance with no requested cluster, an audit event of no workspace."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from drf_spectacular.generators import SchemaGenerator

from apps.audit.actions import do_log_event
from apps.audit.events import Event
from apps.jobs.actions import check_submit_job
from tests.personas import World


@pytest.fixture(scope="module")
def components() -> dict[str, Any]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return dict(schema["components"]["schemas"])


def conforms(components: dict[str, Any], name: str, data: Any) -> None:
    """Validate ``data`` against component ``name``, OpenAPI 3.0's ``nullable`` read as JSON Schema."""
    document = {"components": {"schemas": _json_schema(components)}, "$ref": f"#/components/schemas/{name}"}
    jsonschema.Draft202012Validator(document).validate(data)


def _json_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _json_schema(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable"):
        if "type" in converted:
            converted["type"] = [converted["type"], "null"]
        else:
            converted = {"anyOf": [converted, {"type": "null"}]}
    return converted


def test_a_job_without_gpus_and_an_audit_event_of_no_workspace_match_the_schema(
    world: World, components: dict[str, Any]
) -> None:
    client = world.client(world.alice)
    job = check_submit_job(world.team_a, name="cpu", command="true", acting_user=world.alice)
    do_log_event(Event.USER_UPDATE, world.alice, acting_user=world.alice)

    body = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["gpu_type"] == "" and body["requested_cluster"] is None
    conforms(components, "Job", body)
    events = client.get("/api/v1/audit-events/").json()["results"]
    assert any(event["workspace"] is None for event in events)
    for event in events:
        conforms(components, "AuditEvent", event)


def test_a_name_with_a_letter_beyond_ascii_matches_the_schema(world: World, components: dict[str, Any]) -> None:
    response = world.client(world.admin).post("/api/v1/groups/", {"name": "Équipe"}, format="json")

    assert response.status_code == 201, response.content
    conforms(components, "Group", response.json())
