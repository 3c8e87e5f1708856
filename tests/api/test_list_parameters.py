"""List endpoints read the query parameters they know and refuse the rest: `?workspace=` filters
every list of tenant data (and never reaches another tenant's), and a parameter no filter knows is
a 400 naming it, not a silently unfiltered answer."""

from __future__ import annotations

import pytest

from tests.api.endpoints import ENDPOINTS, Endpoint
from tests.personas import World

TENANT_LISTS = [e for e in ENDPOINTS if e.tenant and e.prefix != "workspaces"]


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
def test_an_unknown_parameter_is_a_400_that_names_it(world: World, endpoint: Endpoint) -> None:
    endpoint.obj(world, world.team_a)
    answer = world.client(world.admin).get(endpoint.list_url, {"colour": "blue", "page_size": "10"})
    assert answer.status_code == 400, answer.content
    fields = answer.json()["error"]["fields"]
    assert list(fields) == ["colour"] and fields["colour"][0].startswith("Unknown query parameter. This list knows: ")


@pytest.mark.parametrize("endpoint", TENANT_LISTS, ids=str)
def test_the_workspace_filter_narrows_every_tenant_list(world: World, endpoint: Endpoint) -> None:
    mine, theirs = endpoint.obj(world, world.team_a), endpoint.obj(world, world.team_b)
    admin = world.client(world.admin)
    ids = lambda answer: {row[endpoint.key] for row in answer.json()["results"]}  # noqa: E731
    a_only = admin.get(endpoint.list_url, {"workspace": world.team_a.name})
    assert a_only.status_code == 200
    assert getattr(mine, endpoint.lookup) in ids(a_only) and getattr(theirs, endpoint.lookup) not in ids(a_only)
    # Naming another tenant's workspace finds nothing of it: the filter narrows, never widens.
    alice = world.client(world.alice)
    assert ids(alice.get(endpoint.list_url, {"workspace": world.team_b.name})) == set()


def test_known_parameters_still_work(world: World) -> None:
    client = world.client(world.alice)
    for query in ({"state": "QUEUED"}, {"ordering": "-created_at"}, {"page": "1"}, {"workspace__name": "team-a"},
                  {"state__in": "QUEUED,RUNNING"}, {"format": "json"}):  # fmt: skip
        assert client.get("/api/v1/jobs/", query).status_code == 200, query
    # Detail routes and their actions keep their own parameters.
    assert client.get("/api/v1/workspaces/team-a/", {"colour": "blue"}).status_code == 200


@pytest.mark.parametrize("path", ["/api/v1/jobs/", "/api/v1/instances/", "/api/v1/notebooks/"])
def test_each_value_of_a_list_of_states_is_checked(world: World, path: str) -> None:
    """`state=BOGUS` was refused and `state__in=BOGUS` answered an empty list, as if no object matched."""
    client = world.client(world.alice)
    refused = client.get(path, {"state__in": "QUEUED,BOGUS"} if "jobs" in path else {"state__in": "BOGUS"})
    assert refused.status_code == 400
    assert "Not a choice: BOGUS" in refused.json()["error"]["fields"]["state__in"][0]
    assert client.get(path, {"state__in": ""}).status_code == 200  # no filter


@pytest.mark.parametrize(
    ("path", "name"), [("/api/v1/workspaces/", "kind"), ("/api/v1/jobs/", "state"), ("/api/v1/instances/", "state")]
)
def test_an_empty_choice_is_refused_not_taken_for_no_filter(world: World, path: str, name: str) -> None:
    """`kind=` answered every workspace, as if the parameter were not there: a client that meant a
    kind and sent none is told so."""
    client = world.client(world.alice)
    refused = client.get(path, {name: ""})
    assert refused.status_code == 400
    assert refused.json()["error"]["fields"][name][0].startswith("Choose among: ")
    assert client.get(path).status_code == 200
