"""The notebook proxy's routes follow the notebooks (apps/compute/hosting.py, ``sync_routes``),
against a real configurable-http-proxy."""

from __future__ import annotations

from apps.compute import proxy as routes
from apps.compute.hosting import sync_routes
from apps.compute.models import Instance, Notebook
from tests.personas import World
from tests.proxy import Proxy


def _routed(notebook: Notebook) -> bool:
    return routes.host_route(notebook.host) in {route.rstrip("/") for route in routes.routes()}


def test_a_starting_notebook_keeps_the_route_its_start_connected_until_it_is_ready(
    proxy: Proxy, tx_world: World
) -> None:
    """A start connects the notebook's route, then records it ready: the upkeep that runs in
    between (another process) leaves the route, or the person who opens the notebook as soon as it
    is ready finds no server behind its host name. A route left by a stopped notebook goes."""
    instance = Instance.objects.create(workspace=tx_world.team_a, name="box", profile=tx_world.cpu_small)
    notebook = Notebook.objects.create(
        workspace=tx_world.team_a, instance=instance, name="nb", profile=tx_world.minimal, state=Notebook.State.STARTING
    )
    routes.add_route(notebook.host, "http://127.0.0.1:9", notebook.pk)
    assert sync_routes() == (0, 0)
    assert _routed(notebook)

    Notebook.objects.filter(pk=notebook.pk).update(state=Notebook.State.READY, proxy_target="http://127.0.0.1:9")
    assert sync_routes() == (0, 0)
    assert _routed(notebook)

    Notebook.objects.filter(pk=notebook.pk).update(state=Notebook.State.STOPPED)
    assert sync_routes() == (1, 0)
    assert not _routed(notebook)
