"""An instance's kubeconfig through the API: a credential, for its workspace's members alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from apps.compute.models import Instance
from apps.inventory.models import Cluster
from tests.backends.kmock_cluster import running_emulator
from tests.kubeconfigs import SERVER, TOKEN, placed, running_namespace_instance
from tests.personas import World


@pytest.fixture
def namespace_instance(world: World) -> Iterator[Instance]:
    with running_emulator() as cluster:
        yield running_namespace_instance(world, cluster)


def test_a_member_gets_the_kubeconfig_as_yaml(world: World, namespace_instance: Instance) -> None:
    response = world.client(world.bob).get(f"/api/v1/instances/{namespace_instance.pk}/kubeconfig/")

    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/yaml"
    assert response["Cache-Control"] == "no-store"
    config = yaml.safe_load(response.content)
    assert config["users"][0]["user"] == {"token": TOKEN}
    assert config["clusters"][0]["cluster"]["server"] == SERVER
    # The same whatever the client says it accepts; an error stays the API's JSON.
    yaml_only = {"HTTP_ACCEPT": "application/yaml"}
    asked = world.client(world.bob).get(f"/api/v1/instances/{namespace_instance.pk}/kubeconfig/", **yaml_only)
    assert asked.status_code == 200 and asked.content == response.content
    missing = world.client(world.bob).get("/api/v1/instances/987654321/kubeconfig/", **yaml_only)
    assert (missing.status_code, missing["Content-Type"]) == (404, "application/json")


def test_another_tenant_gets_a_404_as_for_a_missing_instance(world: World, namespace_instance: Instance) -> None:
    charlie = world.client(world.charlie)  # team B

    response = charlie.get(f"/api/v1/instances/{namespace_instance.pk}/kubeconfig/")
    missing = charlie.get("/api/v1/instances/987654321/kubeconfig/")

    assert response.status_code == 404
    assert TOKEN.encode() not in response.content
    assert response.json() == missing.json()


def test_a_viewer_may_not_have_the_credential(world: World, namespace_instance: Instance) -> None:
    response = world.client(world.victor).get(f"/api/v1/instances/{namespace_instance.pk}/kubeconfig/")

    assert response.status_code == 403
    assert TOKEN.encode() not in response.content


def test_an_instance_without_one_says_why(world: World) -> None:
    local = placed(world, "box", Cluster.objects.get(name="local"), {"version": 1, "replicas": []})
    queued = placed(world, "later", None)
    alice = world.client(world.alice)

    none = alice.get(f"/api/v1/instances/{local.pk}/kubeconfig/")
    not_yet = alice.get(f"/api/v1/instances/{queued.pk}/kubeconfig/")

    assert none.status_code == 404
    assert none.json()["error"]["message"] == "Instance box has no kubeconfig: its local cluster local gives none."
    assert not_yet.status_code == 409
    assert not_yet.json()["error"]["message"] == (
        "Instance later is queued: a kubeconfig, where it has one, comes once it runs."
    )
