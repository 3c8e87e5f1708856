"""Audit event types are the members of one enumeration, each written somewhere, none made up."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from apps.audit.actions import do_log_event
from apps.audit.events import JOB_ENDS, Event
from apps.audit.models import AuditEvent
from apps.jobs.models import Job
from tests.personas import World

ROOT = Path(__file__).resolve().parents[2]
EVENTS_MODULE = ROOT / "apps/audit/events.py"


def _mappings() -> dict[str, set[str]]:
    """The module-level mappings of events.py, by name, with the members they hand out."""
    found: dict[str, set[str]] = {}
    for node in ast.parse(EVENTS_MODULE.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            members = {v.attr for v in node.value.values if isinstance(v, ast.Attribute)}
            found.update({target.id: members for target in node.targets if isinstance(target, ast.Name)})
    return found


def _written() -> set[str]:
    """The members the code names outside events.py, directly or through one of its mappings."""
    code = "\n".join(
        path.read_text()
        for folder in ("apps", "workers")
        for path in (ROOT / folder).rglob("*.py")
        if path != EVENTS_MODULE
    )
    names = set(re.findall(r"\bEvent\.([A-Z][A-Z0-9_]*)\b", code))
    for mapping, members in _mappings().items():
        if re.search(rf"\b{mapping}\b", code):
            names |= members
    return names


def test_it_writes_every_event_type_somewhere() -> None:
    assert set(Event.__members__) - _written() == set()


def test_it_names_only_event_types_that_exist() -> None:
    assert _written() - set(Event.__members__) == set()


def test_it_keeps_one_stored_value_per_event_type() -> None:
    values = [event.value for event in Event.__members__.values()]
    assert len(values) == len(set(values))  # an alias would hide a member
    assert all(re.fullmatch(r"[a-z]+\.[a-z_]+", value) for value in values)
    assert max(map(len, values)) <= AuditEvent._meta.get_field("action").max_length


def test_it_names_the_end_of_a_job_by_a_state_it_can_end_in() -> None:
    assert set(JOB_ENDS) <= set(Job.FINAL_STATES)
    assert all(event.value == f"job.{state.lower()}" for state, event in JOB_ENDS.items())


@pytest.mark.parametrize("action", ["job.exploded", "job.submit", None], ids=["unknown", "plain-string", "none"])
def test_it_refuses_an_event_type_that_is_not_a_member(world: World, action: object) -> None:
    before = AuditEvent.objects.count()

    with pytest.raises(TypeError, match="member of apps.audit.events.Event"):
        do_log_event(action, world.team_a, acting_user=world.alice)  # type: ignore[arg-type]

    assert AuditEvent.objects.count() == before


def test_it_stores_a_members_value(world: World) -> None:
    event = do_log_event(Event.WORKSPACE_UPDATE, world.team_a, acting_user=world.alice, workspace=world.team_a)

    event.refresh_from_db()
    assert event.action == "workspace.update" and type(event.action) is str
