"""Garbage in, a 400 out: every write route of the API, fed malformed bodies, never answers 5xx.

The routes come from the endpoint table (tests/api/endpoints.py), which a test keeps in step with
the router; the garbage for each field comes from the route's serializer. Each kind of garbage
goes into every field at once: a field that refuses it on its own must name itself in "fields".
Values a field lets through would reach validate(), the action and the database, so each of them
is then sent alone, in an otherwise valid body. Every request is rolled back, so each one meets
the same database.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import transaction
from rest_framework import serializers
from rest_framework.fields import Field
from rest_framework.test import APIClient

from apps.accounts.api import TokenView
from apps.api import urls as api_urls
from apps.api.fields import EnvField, NameField, RelativePathListField
from apps.workspaces.actions import do_update_workspace
from tests.api.endpoints import ENDPOINTS, Endpoint, rank, user_of
from tests.personas import PASSWORD, World

HUGE = 10**30
LONG = "x" * 100_001
NUL = "a\x00b"
SURROGATE = "\ud800"  # valid JSON ("\ud800"), but no Unicode text
UNKNOWN_PK = 2**62
REJECT = True

# (what, raw body, content type, statuses when the route reads its body)
BODIES: list[tuple[str, bytes, str, set[int]]] = [
    ("text that is not JSON", b"{not json", "application/json", {400}),
    ("a JSON array", b"[1, 2]", "application/json", {400}),
    ("a JSON string", b'"name"', "application/json", {400}),
    ("a JSON number", b"42", "application/json", {400}),
    ("JSON null", b"null", "application/json", {400}),
    ("JSON true", b"true", "application/json", {400}),
    ("a NaN literal", b'{"name": NaN}', "application/json", {400}),
    ("an Infinity literal", b'{"gpus": Infinity}', "application/json", {400}),
    ("a -Infinity literal", b"[-Infinity]", "application/json", {400}),
    ("100000 nested arrays", b"[" * 100_000 + b"]" * 100_000, "application/json", {400}),
    ("100000 nested objects", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "application/json", {400}),
    ("bytes that are not UTF-8", b'{"name": "\xff\xfe"}', "application/json", {400}),
    ("a 3 MiB body", b'{"name": "' + b"x" * (3 << 20) + b'"}', "application/json", {400}),
    ("a form", b"name=x", "application/x-www-form-urlencoded", {415}),
]


@dataclass
class Route:
    """One write route, a valid body for it, and its serializer's writable fields."""

    method: str
    url: str
    base: dict[str, Any]
    fields: dict[str, Field] = field(default_factory=dict)
    writer: str | None = None  # None: anyone, signed in or not
    reads_body: bool = True
    takes_empty: bool = False  # whether {} is a valid body


def _route(row: Endpoint | None, op: str, world: World) -> Route:
    if row is None:
        credentials = {"username": "alice", "password": PASSWORD}
        return Route("post", "/api/v1/auth/token/", credentials, _writable(TokenView.Credentials()))
    viewset = {prefix: viewset for prefix, viewset, _ in api_urls.router.registry}[row.prefix]
    if op == "create":
        body = row.create(world, world.team_a)  # type: ignore[misc]
        return Route("post", row.list_url, body, _writable(viewset.serializer_class()), row.create_by)
    obj = row.obj(world, world.team_a)
    if op == "update":
        fields = _writable(viewset.serializer_class(instance=obj))
        return Route("patch", row.detail_url(obj), row.patch or {}, fields, row.change_by, takes_empty=True)
    return Route("post", f"{row.detail_url(obj)}{op}/", {}, {}, row.change_by, reads_body=False, takes_empty=True)


def _writable(serializer: serializers.BaseSerializer) -> dict[str, Field]:
    return {name: f for name, f in serializer.fields.items() if not f.read_only}


ROUTES = (
    [pytest.param(row, "create", id=f"POST {row.prefix}") for row in ENDPOINTS if row.create]
    + [pytest.param(row, "update", id=f"PATCH {row.prefix}") for row in ENDPOINTS if row.patch]
    + [pytest.param(row, action, id=f"POST {row.prefix} {action}") for row in ENDPOINTS for action in row.actions]
    + [pytest.param(None, "token", id="POST auth-token")]
)


# --- Garbage, by kind of field -------------------------------------------------------------------


def _garbage(f: Field, valid: Any) -> Iterator[tuple[str, Any, bool]]:
    """(what, value, whether it must be refused) for one field, whose `valid` value is known."""
    if isinstance(f, (serializers.ListField, serializers.ManyRelatedField)):
        yield from _list_garbage(f)
        return
    if isinstance(f, serializers.DictField):
        yield from _dict_garbage(f)
        return
    text = isinstance(f, serializers.CharField)
    numeric = isinstance(f, (serializers.IntegerField, serializers.DecimalField))
    yield "an object", {"k": "v"}, REJECT
    yield "a list", ["x"], REJECT
    yield "null", None, not f.allow_null
    yield "a NUL character", NUL, REJECT
    yield "a lone surrogate", SURROGATE, REJECT
    yield "100k characters", LONG, REJECT
    yield "a boolean", True, not isinstance(f, serializers.BooleanField)
    yield "a number", 12345, not (text or numeric)  # text fields take numbers as text
    if isinstance(f, NameField):
        for bad in ("Bad_Name", "-x", "x-", "a.b", "a" * 64, ""):
            yield f"the name {bad!r}", bad, REJECT
    if text:
        return
    yield "an unknown name", "no-such-thing", REJECT
    yield "10**30", HUGE, REJECT
    yield "-1", -1, not (numeric and f.min_value is not None and f.min_value < 0)
    yield "1.5", 1.5, not isinstance(f, serializers.DecimalField)
    yield "0.333", 0.333, REJECT
    yield '"NaN"', "NaN", REJECT
    yield '"-Infinity"', "-Infinity", REJECT
    if isinstance(f, serializers.PrimaryKeyRelatedField):
        yield "an unknown id", UNKNOWN_PK, REJECT
        if isinstance(valid, int):
            yield "a fractional id", valid + 0.5, REJECT


def _list_garbage(f: Field) -> Iterator[tuple[str, Any, bool]]:
    related = isinstance(f, serializers.ManyRelatedField)
    yield "an object", {"k": "v"}, REJECT
    yield "a string", "x", REJECT
    yield "a number", 12345, REJECT
    yield "null", None, not f.allow_null
    yield "a list of objects", [{"k": "v"}], REJECT
    yield "a list of lists", [["x"]], REJECT
    yield "a list of null", [None], REJECT
    yield "a list with a NUL character", [NUL], REJECT
    yield "a list with a lone surrogate", [SURROGATE], REJECT
    yield "a list with 100k characters", [LONG], REJECT
    yield "a list of 1001 items", [f"item-{i}" for i in range(1001)], related or f.max_length is not None
    if related:
        yield "an unknown name", ["no-such-thing"], REJECT
    if isinstance(f, RelativePathListField):
        for path in ("..", "../etc", "a/../../b", "/etc/passwd"):
            yield f"the path {path!r}", [path], REJECT


def _dict_garbage(f: Field) -> Iterator[tuple[str, Any, bool]]:
    yield "a list", ["x"], REJECT
    yield "a string", "x", REJECT
    yield "a number", 12345, REJECT
    yield "null", None, not f.allow_null
    yield "a NUL character in a value", {"KEY": NUL}, REJECT
    yield "a NUL character in a key", {"K\x00EY": "x"}, REJECT
    yield "a lone surrogate", {"KEY": SURROGATE}, REJECT
    yield "100k characters", {"KEY": LONG}, REJECT
    if isinstance(f, EnvField):
        for key in ("1BAD", "A-B", "", "A B", "X" * 200):
            yield f"the variable name {key!r}", {key: "x"}, REJECT
        yield "an object as value", {"KEY": {"k": "v"}}, REJECT
        yield "null as value", {"KEY": None}, REJECT
        yield "101 variables", {f"V{i}": "x" for i in range(101)}, REJECT


# --- Sending and checking ------------------------------------------------------------------------


def _send(client: APIClient, route: Route, body: Any, content_type: str = "application/json") -> Any:
    """Send `body` (raw bytes, or data as ASCII JSON) and roll back whatever it did."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    savepoint = transaction.savepoint()
    try:
        return client.generic(route.method.upper(), route.url, data, content_type=content_type)
    finally:
        transaction.savepoint_rollback(savepoint)


def _shape_problem(response: Any) -> str | None:
    """What is wrong with a 4xx response's body, if anything: the API has one error shape."""
    try:
        body = response.json()
    except ValueError:
        return f"a body that is not JSON: {response.content[:200]!r}"
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or set(body) != {"error"}:
        return f"not the error shape: {body!r:.300}"
    if error.get("status") != response.status_code or not set(error) <= {
        "status",
        "code",
        "message",
        "fields",
        "field_codes",
    }:
        return f"not the error shape: {error!r:.300}"
    if not (isinstance(error.get("code"), str) and isinstance(error.get("message"), str) and error["message"]):
        return f"no code or message: {error!r:.300}"
    fields = error.get("fields")
    if "fields" in error and not (
        isinstance(fields, dict) and fields and all(isinstance(v, list) and v for v in fields.values())
    ):
        return f"malformed fields: {error!r:.300}"
    return None


def _error(response: Any) -> dict[str, Any]:
    """The error of a response in the API's shape; {} for anything else."""
    if response.status_code < 400 or _shape_problem(response):
        return {}
    return response.json()["error"]  # type: ignore[no-any-return]


def _names(response: Any, name: str) -> bool:
    """Whether the response is a 400 that names the field `name` (or a part of it, "env.KEY")."""
    fields = _error(response).get("fields", {}) if response.status_code == 400 else {}
    return any(key == name or key.startswith(f"{name}.") for key in fields)


@dataclass
class Sweep:
    client: APIClient
    route: Route
    strict: bool  # the persona may use the route: garbage is a 400, not a 403
    problems: list[str] = field(default_factory=list)

    def check(self, what: str, response: Any, refused: bool, statuses: set[int] | None = None) -> None:
        status = response.status_code
        if status >= 500:
            exc = getattr(response, "exc_info", None)
            self.problems.append(f"{what}: {status} {exc[1]!r:.300}" if exc else f"{what}: {status}")
            return
        if status >= 400 and (problem := _shape_problem(response)):
            self.problems.append(f"{what}: {status} with {problem}")
        expected = statuses or {400}
        if refused and status not in (expected if self.strict else expected | {403}):
            self.problems.append(f"{what}: {status} instead of {sorted(expected)}: {response.content[:300]!r}")

    def bodies(self) -> None:
        for what, raw, content_type, statuses in BODIES:
            self.check(what, _send(self.client, self.route, raw, content_type), self.route.reads_body, statuses)
        self.check("an empty object", _send(self.client, self.route, {}), not self.route.takes_empty)

    def fields(self) -> None:
        kinds: dict[str, dict[str, tuple[Any, bool]]] = {}
        for name, f in self.route.fields.items():
            for what, value, refused in _garbage(f, self.route.base.get(name)):
                kinds.setdefault(what, {})[name] = (value, refused)
        for what, values in kinds.items():
            body = {**self.route.base, **{name: value for name, (value, _) in values.items()}}
            response = _send(self.client, self.route, body)
            self.check(f"{what} in {', '.join(values)}", response, any(r for _, r in values.values()))
            if response.status_code == 403 or _error(response).get("code") == "parse_error":
                continue  # refused before any field was read: the same for each field alone
            for name, (value, refused) in values.items():
                if not _names(response, name):  # the field let it through
                    self.alone(what, name, value, refused, response if len(values) == 1 else None)

    def alone(self, what: str, name: str, value: Any, refused: bool, response: Any = None) -> None:
        """Send one field's garbage in an otherwise valid body (unless that was `response`)."""
        if response is None:
            response = _send(self.client, self.route, {**self.route.base, name: value})
            self.check(f"{what} in {name}", response, refused)
        fields = _error(response).get("fields") if response.status_code == 400 else None
        if refused and fields and not _names(response, name):
            self.problems.append(f"{what} in {name}: refused under {fields}")


@pytest.fixture
def roomy_world(world: World) -> World:
    """Room for every launch that happens to be valid, so that limits never answer for garbage."""
    do_update_workspace(world.team_a, max_instances=10_000, max_notebooks=10_000, acting_user=world.admin)
    return world


@pytest.mark.parametrize("persona", ["admin", "alice"])
@pytest.mark.parametrize(("row", "op"), ROUTES)
def test_it_answers_garbage_with_a_400(row: Endpoint | None, op: str, persona: str, roomy_world: World) -> None:
    world = roomy_world
    route = _route(row, op, world)
    client = world.client(user_of(world, persona))
    client.raise_request_exception = False
    # Where the route is not hers, a permission check may answer alice's garbage first (403).
    may = route.writer is None or rank(persona) >= rank(route.writer)
    sweep = Sweep(client, route, strict=may)
    sweep.bodies()
    sweep.fields()
    assert not sweep.problems, "\n".join(sweep.problems)


JOB = {"workspace": "team-a", "name": "train", "command": "python train.py"}
GPU_JOB = {**JOB, "gpu_type": "h100"}

# (persona, route, body, the key its error must come under)
FIELD_ERRORS = [
    ("alice", "instances", {"workspace": "team-a", "name": "Bad_Name", "profile": "gpu-1"}, "name"),
    ("alice", "instances", {"workspace": "team-a", "name": "a" * 64, "profile": "gpu-1"}, "name"),
    ("alice", "instances", {"workspace": "team-b", "name": "box", "profile": "gpu-1"}, "workspace"),
    ("alice", "instances", {"workspace": "team-a", "name": "box", "profile": "no-such-profile"}, "profile"),
    ("alice", "jobs", {**GPU_JOB, "gpus_per_replica": 1.5}, "gpus_per_replica"),
    ("alice", "jobs", {**GPU_JOB, "gpus_per_replica": 0.333}, "gpus_per_replica"),
    ("alice", "jobs", {**GPU_JOB, "gpus_per_replica": -1}, "gpus_per_replica"),
    ("alice", "jobs", {**JOB, "env": {"1BAD": "x"}}, "env"),
    ("alice", "jobs", {**JOB, "env": {"OK": "x\x00"}}, "env.OK"),
    ("alice", "jobs", {**JOB, "artifact_paths": ["out/../../secret"]}, "artifact_paths"),
    ("alice", "jobs", {**JOB, "replicas": 0}, "replicas"),
    ("alice", "jobs", {**JOB, "priority": 10**30}, "priority"),
    ("alice", "jobs", {**JOB, "max_runtime_s": "forever"}, "max_runtime_s"),
    ("alice", "jobs", {**JOB, "command": ""}, "command"),
    ("alice", "jobs", {**JOB, "description": "a\x00b"}, "description"),
    ("alice", "memberships", {"workspace": "team-a", "user": "charlie", "role": "boss"}, "role"),
    ("alice", "memberships", {"workspace": "team-a", "user": "nobody"}, "user"),
    ("admin", "compute-profiles", {"name": "p", "gpu_type": "h100", "gpu_count": "1.5"}, "gpu_count"),
    ("admin", "compute-profiles", {"name": "p", "gpu_count": "1"}, "gpu_type"),
    ("admin", "notebook-profiles", {"name": "p", "image": "   "}, "image"),
    ("admin", "notebook-profiles", {"name": "p", "image": "quay.io/jupyter/minimal notebook"}, "image"),
    ("admin", "quotas", {"workspace": "team-a", "gpu_type": "H 100", "gpus": "1"}, "gpu_type"),
    ("admin", "quotas", {"workspace": "team-a", "gpu_type": "a100", "gpus": "-1"}, "gpus"),
    ("admin", "users", {"username": "eve", "password": "123"}, "password"),
    ("admin", "users", {"username": "eve", "groups": ["no-such-group"]}, "groups"),
    ("admin", "workspaces", {"name": "team-c", "assignee_kind": "team"}, "assigned_group"),
    ("admin", "workspaces", {"name": "team-c", "allowed_gpu_types": ["H100"]}, "allowed_gpu_types.0"),
    ("admin", "clusters", {"name": "c", "kind": "slurm", "connection": {"token": "x\x00"}}, "connection.token"),
]


@pytest.mark.parametrize(
    ("persona", "prefix", "body", "key"), FIELD_ERRORS, ids=lambda v: v if isinstance(v, str) else ""
)
def test_it_names_the_field_in_error(persona: str, prefix: str, body: dict[str, Any], key: str, world: World) -> None:
    response = world.client(user_of(world, persona)).post(f"/api/v1/{prefix}/", body, format="json")
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert list(error["fields"]) == [key]
    assert error["fields"][key][0] in error["message"]
