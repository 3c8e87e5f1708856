"""An instance's kubeconfig, from its cluster's backend (``Backend.kubeconfig()``): the instance page
and the API hand out the same one, to the instance's workspace members alone (the callers check)."""

from __future__ import annotations

from http import HTTPStatus

from apps.compute.models import Instance
from apps.errors import ActionError, Conflict
from apps.workloads import host
from workers.backends.base import BackendError


class NoKubeconfig(ActionError):
    """The instance's backend gives no kubeconfig (only Kubernetes namespace and vcluster instances have one)."""

    status_code = HTTPStatus.NOT_FOUND
    code = "no_kubeconfig"


def read_kubeconfig(instance: Instance) -> str:
    """The kubeconfig (YAML) of a running instance. ``NoKubeconfig`` where its backend has none;
    ``Conflict`` while the instance does not run, or its backend is still issuing it."""
    if instance.cluster is None or instance.state != Instance.State.RUNNING:
        state = instance.get_state_display().lower()
        raise Conflict(f"Instance {instance.name} is {state}: a kubeconfig, where it has one, comes once it runs.")
    try:
        config = host.backend_of(host.kind_of("instance"), instance).kubeconfig()
    except BackendError as exc:
        raise Conflict(f"The kubeconfig of instance {instance.name} is not ready: {exc.message}") from None
    if config is None:
        where = f"its {instance.cluster.kind} cluster {instance.cluster.name}"
        raise NoKubeconfig(f"Instance {instance.name} has no kubeconfig: {where} gives none.")
    return config
