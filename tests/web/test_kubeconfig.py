"""The instance page's kubeconfig: the same one the API hands out, to the workspace's members alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from django.test import Client

from apps.compute.models import Instance
from tests.backends.kmock_cluster import running_emulator
from tests.kubeconfigs import TOKEN, running_namespace_instance
from tests.personas import World

SignedIn = Callable[[Any], Client]


@pytest.fixture
def namespace_instance(world: World) -> Iterator[Instance]:
    with running_emulator() as cluster:
        yield running_namespace_instance(world, cluster)


def test_a_member_downloads_the_kubeconfig_from_the_instance_page(
    world: World, signed_in: SignedIn, namespace_instance: Instance
) -> None:
    bob = signed_in(world.bob)
    page = bob.get(f"/w/team-a/instances/{namespace_instance.pk}/").content.decode()
    assert "Download kubeconfig" in page

    response = bob.get(f"/w/team-a/instances/{namespace_instance.pk}/kubeconfig/")

    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="team-a-dev.kubeconfig"'
    assert yaml.safe_load(response.content)["users"][0]["user"] == {"token": TOKEN}


def test_no_one_else_gets_it(world: World, signed_in: SignedIn, namespace_instance: Instance) -> None:
    url = f"/w/team-a/instances/{namespace_instance.pk}/kubeconfig/"
    assert signed_in(world.charlie).get(url).status_code == 404  # another tenant
    assert signed_in(world.victor).get(url).status_code == 403  # a viewer of team A
    assert signed_in(world.charlie).get(f"/w/team-b/instances/{namespace_instance.pk}/kubeconfig/").status_code == 404
